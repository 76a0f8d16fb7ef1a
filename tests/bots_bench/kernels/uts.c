/*
 * hidvfs test kernel "uts": an unbalanced (binomial) tree search with one task per child.
 * The root has b0 children; every other node has m children with probability q, else none,
 * decided by a splitmix64 hash of the parent's state and the child index (deterministic for
 * a seed, whatever the schedule). -f names a small text file of "key value" lines:
 * b0, m, q, seed, and optionally nodes (the expected tree size, used by -c; without it the
 * check prints n/a). Prints Nodes and Nodes/Sec like the real kernel.
 */
#define KERNEL_FLAGS "f"
#include "harness.h"

static int B0 = 4, MCH = 4;
static double Q = 0.2;
static unsigned long long SEED = 1;
static long expected = -1;

static unsigned long long mix(unsigned long long z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static long search(unsigned long long state, int depth)
{
    int kids = depth == 0 ? B0 : ((double)(mix(state) >> 11) * 0x1.0p-53 < Q ? MCH : 0);
    long count = 1;
    for (int c = 0; c < kids; c++) {
        unsigned long long child = mix(state ^ (0xD1B54A32D192ED03ull * (unsigned long long)(c + 1)));
#pragma omp task untied firstprivate(child, depth) shared(count)
        {
            long sub = search(child, depth + 1);
#pragma omp atomic
            count += sub;
        }
    }
#pragma omp taskwait
    return count;
}

static void read_input(const char *path)
{
    char key[64];
    double v;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stdout, "Error: cannot open input file %s\n", path);
        exit(101);
    }
    while (fscanf(f, "%63s %lf", key, &v) == 2) {
        if (!strcmp(key, "b0")) B0 = (int)v;
        else if (!strcmp(key, "m")) MCH = (int)v;
        else if (!strcmp(key, "q")) Q = v;
        else if (!strcmp(key, "seed")) SEED = (unsigned long long)v;
        else if (!strcmp(key, "nodes")) expected = (long)v;
        else {
            fprintf(stdout, "Error: unknown key %s in %s\n", key, path);
            exit(101);
        }
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    long nodes = 0;
    parse_args(argc, argv);
    if (!opt.file) {
        fprintf(stdout, "Error: -f <input file> is mandatory\n");
        return 101;
    }
    read_input(opt.file);
    init_run("Unbalance Tree Search");
    snprintf(run.parameters, sizeof run.parameters, "%s", opt.file);
    message("Tree type: binomial, b0=%d m=%d q=%f seed=%llu\n", B0, MCH, Q, SEED);
    message("Computing Unbalance Tree Search algorithm ");
    double t0 = wall_now();
#pragma omp parallel
#pragma omp single
    nodes = search(mix(SEED), 0);
    run.time_program = wall_now() - t0;
    message("Tree size = %ld\n", nodes);
    message("completed!");
    if (fault_is("bad"))
        nodes += 1;
    run.tasks = nodes;
    after_kernel();
    if (opt.check)
        run.result = expected < 0 ? RES_NA : (nodes == expected ? RES_OK : RES_BAD);
    print_results();
    return 0;
}
