/*
 * hidvfs test kernel "concom": connected components of a random graph of -n nodes, -l random
 * links and at most -m neighbours per node. Each component is explored by a depth-first
 * search that spawns a task per unvisited neighbour (a critical section claims a node), then
 * waits. Like the real kernel it always printf()s a "Graph ..., Number of components ..." line,
 * whatever the verbosity. -c also counts the components sequentially (union-find) and compares.
 */
#define KERNEL_FLAGS "nml"
#include "harness.h"

static int N, M;
static int *deg, *adj, *comp;

static void add_edge(int u, int v)
{
    if (u == v || deg[u] >= M || deg[v] >= M)
        return;
    for (int k = 0; k < deg[u]; k++)
        if (adj[u * M + k] == v)
            return;
    adj[u * M + deg[u]++] = v;
    adj[v * M + deg[v]++] = u;
}

static void visit(int u, int c)
{
    for (int k = 0; k < deg[u]; k++) {
        int v = adj[u * M + k], mine = 0;
#pragma omp critical(claim)
        if (comp[v] < 0) {
            comp[v] = c;
            mine = 1;
        }
        if (mine) {
#pragma omp task untied firstprivate(v, c)
            visit(v, c);
        }
    }
#pragma omp taskwait
}

static int find(int *p, int x)
{
    while (p[x] != x) {
        p[x] = p[p[x]];
        x = p[x];
    }
    return x;
}

static int count_sequential(void)
{
    int *p = malloc(sizeof(int) * (size_t)N), n = N;
    for (int i = 0; i < N; i++)
        p[i] = i;
    for (int u = 0; u < N; u++)
        for (int k = 0; k < deg[u]; k++) {
            int a = find(p, u), b = find(p, adj[u * M + k]);
            if (a != b) {
                p[a] = b;
                n--;
            }
        }
    free(p);
    return n;
}

int main(int argc, char **argv)
{
    opt.n = 100000;
    opt.m = 20;
    opt.l = 100000;
    parse_args(argc, argv);
    if (opt.n < 1 || opt.m < 1 || opt.l < 0) {
        fprintf(stdout, "Error: bad sizes\n");
        return 101;
    }
    if (!opt.l_set)
        opt.l = opt.n;
    N = (int)opt.n;
    M = (int)opt.m;
    init_run("Connected Components");
    snprintf(run.parameters, sizeof run.parameters, "N=%d,L=%ld,M=%d", N, opt.l, M);
    deg = calloc((size_t)N, sizeof(int));
    adj = malloc(sizeof(int) * (size_t)N * (size_t)M);
    comp = malloc(sizeof(int) * (size_t)N);
    unsigned long long s = 88172645463325252ull;
    for (long e = 0; e < opt.l; e++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        int u = (int)(s % (unsigned long long)N);
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        add_edge(u, (int)(s % (unsigned long long)N));
    }
    for (int i = 0; i < N; i++)
        comp[i] = -1;
    int ncomp = 0;
    double t0 = wall_now();
#pragma omp parallel
#pragma omp single
    for (int i = 0; i < N; i++) {
        if (comp[i] >= 0)
            continue;
        comp[i] = ncomp;
        visit(i, ncomp);
        message("Component %d found\n", ncomp);
        ncomp++;
    }
    run.time_program = wall_now() - t0;
    if (fault_is("bad"))
        ncomp += 1;
    printf("Graph %d, Number of components %d\n", 0, ncomp);
    after_kernel();
    if (opt.check) {
        t0 = wall_now();
        int expect = count_sequential();
        run.time_sequential = wall_now() - t0;
        run.seq_ran = 1;
        run.result = expect == ncomp ? RES_OK : RES_BAD;
    }
    print_results();
    return 0;
}
