// Stream driver for a Verilated Amaranth component (ptocube.sim.verilator).
//
// The design-specific part is the generated "ports.h": how many input/output streams and
// static inputs the top level has, their payload sizes in 32-bit words, and accessors
// (in_drive/in_ready, out_drive/out_valid/out_payload, static_set, probe_get, clk_set/rst_set).
// This file is generic.
//
// It reads requests on stdin and answers on stdout; the model keeps its state between
// requests, so one process can run many phases.  Numbers are decimal, payloads hex (most
// significant digit first, any length).  Requests:
//
//   static K HEX              set static input K (kept until changed)
//   reset N                   hold rst high for N cycles (not counted as run cycles)
//   monitor K ON              output stream K (ON = 1) is ready in every cycle of every run
//                             and its transfers are reported by each run; ON = 0 stops that
//   quiet K N                 this run also lasts until probe (plain output) K has read zero
//                             at N clock edges in a row
//   feed K N                  input stream K gets N beats, then N lines "IDLE HEX": IDLE
//                             cycles with valid low before the beat is offered
//   drain K N                 output stream K takes N transfers, then N lines "STALL": cycles
//                             with ready low before ready is raised for that transfer
//   go MAX_CYCLES SETTLE MIN  run (at least MIN cycles) until every feed is consumed and
//                             every drain has its transfers plus SETTLE more ready cycles
//                             (surplus transfers: "extra"); give up after MAX_CYCLES
//   quit
//
// Answer to go:
//   done CYCLES TOTAL NANOS | timeout CYCLES TOTAL NANOS
//                             CYCLES: cycle of the last expected output transfer (of the
//                             last input transfer without drains, the convention of
//                             ptocube.sim.harness.run_streams); TOTAL: cycles run;
//                             NANOS: CPU time of the cycle loop
//   fed K CONSUMED            for every feed
//   drain K N  + N lines "CYCLE HEX"      transfers; CYCLE counts from 1 at the run's first edge
//   extra K M  + M lines "CYCLE HEX"
//   monitor K M + M lines "CYCLE HEX"     for every monitored stream
//   probe K HEX               every probe's value after the run
//   end

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <time.h>

#include "verilated.h"

namespace {

// Scalar ports (CData/SData/IData/QData) and wide ports (VlWide) from/to 32-bit words.
template <class T> void put(T& port, const uint32_t* w, int words) {
    uint64_t v = w[0];
    if (words > 1) v |= static_cast<uint64_t>(w[1]) << 32;
    port = static_cast<T>(v);
}
template <std::size_t N> void put(VlWide<N>& port, const uint32_t* w, int) {
    for (std::size_t i = 0; i < N; ++i) port[i] = w[i];
}
template <class T> void get(const T& port, uint32_t* w, int words) {
    uint64_t v = port;
    w[0] = static_cast<uint32_t>(v);
    if (words > 1) w[1] = static_cast<uint32_t>(v >> 32);
}
template <std::size_t N> void get(const VlWide<N>& port, uint32_t* w, int) {
    for (std::size_t i = 0; i < N; ++i) w[i] = port[i];
}

}  // namespace

// Generated: includes the model's header, defines VTOP, N_IN, N_OUT, N_STATIC, N_PROBE,
// IN_WORDS, OUT_WORDS, STATIC_WORDS, PROBE_WORDS, MAX_WORDS and the accessors (which use
// put/get above).
#include "ports.h"

namespace {

bool is_zero(const uint32_t* w, int words) {
    for (int i = 0; i < words; ++i)
        if (w[i]) return false;
    return true;
}

bool parse_hex(const char* s, uint32_t* w, int words) {
    std::memset(w, 0, sizeof(uint32_t) * words);
    int n = static_cast<int>(std::strlen(s));
    for (int i = 0; i < n; ++i) {
        char c = s[n - 1 - i];
        uint32_t d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return false;
        if (d == 0) continue;
        if (i / 8 >= words) return false;
        w[i / 8] |= d << (4 * (i % 8));
    }
    return true;
}

void print_hex(const uint32_t* w, int words) {
    int top = words - 1;
    while (top > 0 && w[top] == 0) --top;
    std::printf("%x", w[top]);
    for (int i = top - 1; i >= 0; --i) std::printf("%08x", w[i]);
}

// Transfers of one output stream: cycles and payload words.
struct Log {
    std::vector<uint64_t> cycles;
    std::vector<uint32_t> words;

    void add(uint64_t cycle, const uint32_t* w, int n) {
        cycles.push_back(cycle);
        words.insert(words.end(), w, w + n);
    }
    void print(const char* kind, int k, int n) const {
        std::printf("%s %d %zu\n", kind, k, cycles.size());
        for (size_t j = 0; j < cycles.size(); ++j) {
            std::printf("%llu ", static_cast<unsigned long long>(cycles[j]));
            print_hex(&words[j * n], n);
            std::putchar('\n');
        }
    }
};

struct Feed {
    bool active = false;
    std::vector<uint32_t> idle;
    std::vector<uint32_t> words;   // payload j at [j * IN_WORDS[k]]
    size_t next = 0;
    uint32_t waited = 0;           // idle cycles spent before beat `next`
};

struct Drain {
    bool active = false;
    bool monitored = false;
    std::vector<uint32_t> stall;
    Log got, extra, seen;          // expected transfers, surplus, monitored
    uint32_t stalled = 0;          // not-ready cycles spent before the next transfer
    uint64_t finished = 0;         // cycle of the last expected transfer
    int settle_left = 0;
};

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "verilator harness: %s\n", what);
    std::exit(2);
}

long long cpu_nanos() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

void tick(VTOP* top, VerilatedContext* ctx) {
    clk_set(top, true);
    top->eval();
    ctx->timeInc(1);
    clk_set(top, false);
}

}  // namespace

int main(int argc, char** argv) {
    auto ctx = std::make_unique<VerilatedContext>();
    ctx->commandArgs(argc, argv);
    auto top = std::make_unique<VTOP>(ctx.get());
    clk_set(top.get(), false);
    rst_set(top.get(), false);
    top->eval();

    std::vector<Feed> feeds(N_IN + 1);
    std::vector<Drain> drains(N_OUT + 1);
    std::vector<uint32_t> buf(MAX_WORDS + 1);
    std::vector<char> in_valid(N_IN + 1), out_ready(N_OUT + 1), expecting(N_OUT + 1),
        settling(N_OUT + 1);
    std::vector<long> quiet_for(N_PROBE + 1, 0);   // 0: no wait on this probe
    std::vector<char> hex(MAX_WORDS * 8 + 64);
    char word[64], format[32];
    std::snprintf(format, sizeof format, "%%%zus", hex.size() - 1);

    while (std::scanf("%63s", word) == 1) {
        std::string cmd(word);
        if (cmd == "quit") break;
        if (cmd == "static") {
            int k;
            if (std::scanf("%d", &k) != 1 || k < 0 || k >= N_STATIC ||
                std::scanf(format, hex.data()) != 1)
                fail("bad static");
            if (!parse_hex(hex.data(), buf.data(), STATIC_WORDS[k])) fail("static value too wide");
            static_set(top.get(), k, buf.data());
        } else if (cmd == "reset") {
            long n;
            if (std::scanf("%ld", &n) != 1) fail("bad reset");
            rst_set(top.get(), true);
            for (long i = 0; i < n; ++i) { top->eval(); tick(top.get(), ctx.get()); }
            rst_set(top.get(), false);
            top->eval();
        } else if (cmd == "monitor") {
            int k, on;
            if (std::scanf("%d %d", &k, &on) != 2 || k < 0 || k >= N_OUT) fail("bad monitor");
            drains[k].monitored = on != 0;
        } else if (cmd == "quiet") {
            int k;
            long n;
            if (std::scanf("%d %ld", &k, &n) != 2 || k < 0 || k >= N_PROBE) fail("bad quiet");
            quiet_for[k] = n;
        } else if (cmd == "feed") {
            int k;
            long n;
            if (std::scanf("%d %ld", &k, &n) != 2 || k < 0 || k >= N_IN) fail("bad feed");
            Feed& f = feeds[k];
            f = Feed();
            f.active = true;
            f.idle.resize(n);
            f.words.assign(static_cast<size_t>(n) * IN_WORDS[k], 0);
            for (long j = 0; j < n; ++j) {
                if (std::scanf("%u", &f.idle[j]) != 1 || std::scanf(format, hex.data()) != 1)
                    fail("bad feed beat");
                if (!parse_hex(hex.data(), &f.words[j * IN_WORDS[k]], IN_WORDS[k]))
                    fail("feed payload too wide");
            }
        } else if (cmd == "drain") {
            int k;
            long n;
            if (std::scanf("%d %ld", &k, &n) != 2 || k < 0 || k >= N_OUT) fail("bad drain");
            Drain& d = drains[k];
            d.active = true;
            d.stall.resize(n);
            for (long j = 0; j < n; ++j)
                if (std::scanf("%u", &d.stall[j]) != 1) fail("bad drain stall");
        } else if (cmd == "go") {
            unsigned long long max_cycles, min_cycles;
            int settle;
            if (std::scanf("%llu %d %llu", &max_cycles, &settle, &min_cycles) != 3)
                fail("bad go");
            bool any_drain = false;
            for (int k = 0; k < N_OUT; ++k) {
                Drain& d = drains[k];
                d.settle_left = settle;
                d.stalled = 0;
                d.finished = 0;
                d.got = d.extra = d.seen = Log();
                any_drain |= d.active;
            }
            long long started = cpu_nanos();
            uint64_t cycle = 0, last_in = 0;
            bool timeout = false;
            std::vector<long> quiet(N_PROBE + 1, 0);     // zero readings in a row
            for (;;) {
                bool busy = cycle < min_cycles;
                for (int k = 0; k < N_PROBE; ++k) busy |= quiet[k] < quiet_for[k];
                for (int k = 0; k < N_IN; ++k) {
                    Feed& f = feeds[k];
                    bool pending = f.active && f.next < f.idle.size();
                    busy |= pending;
                    in_valid[k] = pending && f.waited >= f.idle[f.next];
                    in_drive(top.get(), k, in_valid[k],
                             in_valid[k] ? &f.words[f.next * IN_WORDS[k]] : buf.data());
                }
                for (int k = 0; k < N_OUT; ++k) {
                    Drain& d = drains[k];
                    expecting[k] = d.active && d.got.cycles.size() < d.stall.size();
                    settling[k] = d.active && !expecting[k] && d.settle_left > 0;
                    busy |= expecting[k] || settling[k];
                    out_ready[k] = d.monitored || settling[k] ||
                                   (expecting[k] && d.stalled >= d.stall[d.got.cycles.size()]);
                    out_drive(top.get(), k, out_ready[k]);
                }
                if (!busy) break;
                if (cycle >= max_cycles) {
                    timeout = true;
                    break;
                }
                top->eval();
                ++cycle;
                for (int k = 0; k < N_PROBE; ++k) {
                    if (!quiet_for[k]) continue;
                    probe_get(top.get(), k, buf.data());
                    quiet[k] = is_zero(buf.data(), PROBE_WORDS[k]) ? quiet[k] + 1 : 0;
                }
                for (int k = 0; k < N_IN; ++k) {
                    Feed& f = feeds[k];
                    if (in_valid[k] && in_ready(top.get(), k)) {
                        ++f.next;
                        f.waited = 0;
                        last_in = cycle;
                    } else if (f.active && f.next < f.idle.size() && !in_valid[k]) {
                        ++f.waited;
                    }
                }
                for (int k = 0; k < N_OUT; ++k) {
                    Drain& d = drains[k];
                    if (out_ready[k] && out_valid(top.get(), k)) {
                        out_payload(top.get(), k, buf.data());
                        if (expecting[k]) {
                            d.got.add(cycle, buf.data(), OUT_WORDS[k]);
                            d.stalled = 0;
                            if (d.got.cycles.size() == d.stall.size()) d.finished = cycle;
                        } else if (settling[k]) {
                            d.extra.add(cycle, buf.data(), OUT_WORDS[k]);
                        } else {
                            d.seen.add(cycle, buf.data(), OUT_WORDS[k]);
                        }
                    } else if (expecting[k] && !out_ready[k]) {
                        ++d.stalled;
                    }
                    if (settling[k]) --d.settle_left;
                }
                tick(top.get(), ctx.get());
            }
            long long nanos = cpu_nanos() - started;
            // Streams at rest between requests.
            for (int k = 0; k < N_IN; ++k) in_drive(top.get(), k, false, buf.data());
            for (int k = 0; k < N_OUT; ++k) out_drive(top.get(), k, false);
            top->eval();

            uint64_t finished = last_in;
            if (any_drain) {
                finished = 0;
                for (int k = 0; k < N_OUT; ++k)
                    if (drains[k].active && drains[k].finished > finished)
                        finished = drains[k].finished;
            }
            std::printf("%s %llu %llu %lld\n", timeout ? "timeout" : "done",
                        static_cast<unsigned long long>(timeout ? cycle : finished),
                        static_cast<unsigned long long>(cycle), static_cast<long long>(nanos));
            for (int k = 0; k < N_IN; ++k)
                if (feeds[k].active) std::printf("fed %d %zu\n", k, feeds[k].next);
            for (int k = 0; k < N_OUT; ++k) {
                const Drain& d = drains[k];
                if (d.active) {
                    d.got.print("drain", k, OUT_WORDS[k]);
                    d.extra.print("extra", k, OUT_WORDS[k]);
                }
                if (d.monitored) d.seen.print("monitor", k, OUT_WORDS[k]);
            }
            for (int k = 0; k < N_PROBE; ++k) {
                probe_get(top.get(), k, buf.data());
                std::printf("probe %d ", k);
                print_hex(buf.data(), PROBE_WORDS[k]);
                std::putchar('\n');
            }
            std::printf("end\n");
            std::fflush(stdout);
            for (auto& f : feeds) f.active = false;
            for (auto& d : drains) d.active = false;
            for (auto& q : quiet_for) q = 0;
        } else {
            fail("unknown request");
        }
    }
    top->final();
    return 0;
}
