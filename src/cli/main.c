/* hypershard — command-line entry: dispatch to a subcommand. */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

typedef struct hs_subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} hs_subcommand;

static const hs_subcommand commands[] = {
    {"train", hs_cmd_train,
     "train [CONFIG] [a.b.c=value ...]   train a model (under mpiexec for several ranks)"},
    {"launch", hs_cmd_launch,
     "launch [-n N] [--hostfile F] [--max-restarts K] [--min-ranks M] [CONFIG] [a.b.c=value ...]   train under mpiexec, restarting a failed job from its checkpoints"},
    {"config", hs_cmd_config,
     "config [CONFIG] [a.b.c=value ...] [--world N]   print the resolved config"},
    {"plan", hs_cmd_plan,
     "plan [CONFIG] [a.b.c=value ...] [--world N] [--json]   memory and comm plan"},
    {"mesh", hs_cmd_mesh, "mesh --world N [key=value ...]   print rank coordinates and groups"},
    {"generate", hs_cmd_generate,
     "generate (--run DIR | --ckpt DIR) --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]   continue a prompt"},
    {"eval", hs_cmd_eval,
     "eval (--run DIR | --ckpt DIR) [data.* ...]   validation loss and perplexity"},
    {"tokenize", hs_cmd_tokenize,
     "tokenize TOKENIZER_JSON TEXT   token ids of TEXT (byte-level BPE) and their decoding"},
    {"export", hs_cmd_export,
     "export --safetensors OUT_DIR (--run DIR | --ckpt DIR)   write Hugging Face weights"},
    {"ckpt", hs_cmd_ckpt,
     "ckpt inspect DIR | verify DIR | export DIR --safetensors OUT_DIR   look into a distributed checkpoint"},
    {"import", hs_cmd_import, "import SAFETENSORS_DIR ...   start from given weights"},
};

static const hs_subcommand benches[] = {
    {"comm", hs_bench_comm, "bench comm   collective bandwidth vs MPI built-ins (under mpiexec)"},
    {"step", hs_bench_step, "bench step   training throughput and MFU, one process or FSDP over W"},
    {"ops", hs_bench_ops,
     "bench ops    each device kernel's time and GFLOP/s or GB/s per compiled backend"},
    {"fsdp", hs_bench_fsdp,
     "bench fsdp   prefetch x comm fusion: step time, exposed comm, collectives, bytes (under mpiexec)"},
    {"cp", hs_bench_cp,
     "bench cp     FSDP vs CP 2/4 allgather and ring on long sequences: step time, exposed CP comm, memory (under mpiexec)"},
    {"moe", hs_bench_moe,
     "bench moe    EP 1/2/4 with experts on the EDP mesh: step time, exposed all-to-all, memory (under mpiexec)"},
    {"pp", hs_bench_pp,
     "bench pp     PP 2/4 gpipe vs 1f1b vs interleaved: step time, measured bubble vs the ideal, memory (under mpiexec)"},
    {"calibrate", hs_bench_calibrate,
     "bench calibrate --out FILE   this machine's GEMM, attention, memory and collective rates as a cluster file"},
    {"tp", hs_bench_tp,
     "bench tp     FSDP vs TP x FSDP (+ sequence parallel): step time, exposed TP comm (under mpiexec)"},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void usage(FILE *f) {
    fprintf(f, "usage: hypershard COMMAND [args]\n\ncommands:\n");
    for (int i = 0; i < COUNT(commands); i++) fprintf(f, "  %s\n", commands[i].usage);
    for (int i = 0; i < COUNT(benches); i++) fprintf(f, "  %s\n", benches[i].usage);
}

/* The fault-injection hooks the tests use read variables of one
 * namespace, HS_*_TEST_* (docs/errors.md): none fires unless one is set,
 * and a run that has one set says so on stderr, so none acts unseen. */
static void test_variables_named(void) {
    extern char **environ;
    for (char **v = environ; v && *v; v++)
        if (!strncmp(*v, "HS_", 3) && strstr(*v, "_TEST_") && strchr(*v, '='))
            fprintf(stderr, "hypershard: test-only variable set, it injects faults: %s\n", *v);
}

int main(int argc, char **argv) {
    /* FSDP frees each unit's all-gather output on reshard and allocates it
     * again at the next unshard (the memory saving is the point). glibc
     * would hand such multi-MB blocks back to the kernel every time and pay
     * the page faults again each step; keeping them in the heap makes the
     * reuse cheap while the pools' accounting stays exact. */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    /* A write past the file size limit (ulimit -f) fails with EFBIG and
     * is reported naming the file, instead of killing the process. */
    signal(SIGXFSZ, SIG_IGN);
    test_variables_named();
    /* The CPU tier (HS_CPU_ISA) before any kernel is chosen. */
    hs_error e = {0};
    if (hs_cpu_isa_apply(&e) != HS_OK) {
        fprintf(stderr, "hypershard: %s\n", e.msg);
        return hs_status_exit_code(e.code);
    }
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "bench")) {
        for (int i = 0; argc >= 3 && i < COUNT(benches); i++)
            if (!strcmp(argv[2], benches[i].name)) return benches[i].run(argc - 2, argv + 2);
        fprintf(stderr, "hypershard bench: unknown benchmark '%s'\n", argc >= 3 ? argv[2] : "");
        usage(stderr);
        return 2;
    }
    for (int i = 0; i < COUNT(commands); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "hypershard: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
