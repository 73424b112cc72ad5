# D = C + A x B, FP16 inputs, FP32 accumulator (hardware numeric profile: one
# RNE_fp32 fused multiply-add per K term, starting from C).
BSTART.TMATMUL.ACC FP16
B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0
B.DIM zero, 2, ->LB0
B.DIM zero, 3, ->LB1
B.DIM zero, 4, ->LB2
B.IOT U#1, M#1, mask=1111              # C, A
B.IOT N#1, mask=1111, last, ->U<256B>  # B; D -> a new U register (U#2)
BSTOP
