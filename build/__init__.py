"""FPGA build flow: Verilog export, bitstreams and reports through amaranth-boards and YoWASP."""
