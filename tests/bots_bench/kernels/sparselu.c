/*
 * hidvfs test kernel "sparselu": LU factorisation (no pivoting) of a diagonally dominant
 * blocked sparse matrix of -n x -n blocks of -m x -m doubles. For every diagonal block kk:
 * factor it, then one task per non-empty block of row kk (forward substitution) and of
 * column kk (division), a taskwait, then one task per trailing update (allocating fill-in
 * blocks first), and a taskwait: a phase-barriered wavefront of tasks.
 * Built as sparselu.gcc.single-omp-tasks (one generating thread) and, with -DFOR_VERSION,
 * as sparselu.gcc.for-omp-tasks (tasks generated inside worksharing loops).
 * -c also runs a sequential factorisation (Time Sequential) and compares the two results.
 */
#define KERNEL_FLAGS "nm"
#include "harness.h"
#include <math.h>

static int NB, BS;

static double *new_block(void)
{
    double *b = calloc((size_t)BS * (size_t)BS, sizeof(double));
    if (!b) {
        fprintf(stdout, "Error: out of memory\n");
        exit(102);
    }
    return b;
}

static int present(int i, int j) { return i == j || abs(i - j) == 1 || (i * 7 + j * 3) % 5 == 0; }

static double **make_matrix(void)
{
    double **A = calloc((size_t)NB * (size_t)NB, sizeof(double *));
    unsigned int s = 12345u;
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < NB; j++) {
            if (!present(i, j))
                continue;
            double *b = A[i * NB + j] = new_block();
            for (int k = 0; k < BS * BS; k++) {
                s = s * 1103515245u + 12345u;
                b[k] = ((double)((s >> 16) & 0x7fff) / 32768.0) - 0.5;
            }
            if (i == j)
                for (int k = 0; k < BS; k++)
                    b[k * BS + k] += 2.0 * NB * BS;
        }
    return A;
}

static double **copy_matrix(double **A)
{
    double **C = calloc((size_t)NB * (size_t)NB, sizeof(double *));
    for (int k = 0; k < NB * NB; k++)
        if (A[k]) {
            C[k] = new_block();
            memcpy(C[k], A[k], sizeof(double) * (size_t)BS * (size_t)BS);
        }
    return C;
}

static void free_matrix(double **A)
{
    for (int k = 0; k < NB * NB; k++)
        free(A[k]);
    free(A);
}

/* in-place LU of a diagonal block: unit lower L below, U on and above the diagonal */
static void lu0(double *d)
{
    for (int k = 0; k < BS; k++)
        for (int i = k + 1; i < BS; i++) {
            d[i * BS + k] /= d[k * BS + k];
            for (int j = k + 1; j < BS; j++)
                d[i * BS + j] -= d[i * BS + k] * d[k * BS + j];
        }
}

/* row block: b := L(d)^-1 b */
static void fwd(const double *d, double *b)
{
    for (int k = 0; k < BS; k++)
        for (int i = k + 1; i < BS; i++)
            for (int j = 0; j < BS; j++)
                b[i * BS + j] -= d[i * BS + k] * b[k * BS + j];
}

/* column block: b := b U(d)^-1 */
static void bdiv(const double *d, double *b)
{
    for (int i = 0; i < BS; i++)
        for (int k = 0; k < BS; k++) {
            b[i * BS + k] /= d[k * BS + k];
            for (int j = k + 1; j < BS; j++)
                b[i * BS + j] -= b[i * BS + k] * d[k * BS + j];
        }
}

/* trailing update: c -= r * col */
static void bmod(const double *r, const double *col, double *c)
{
    for (int i = 0; i < BS; i++)
        for (int k = 0; k < BS; k++) {
            double v = r[i * BS + k];
            for (int j = 0; j < BS; j++)
                c[i * BS + j] -= v * col[k * BS + j];
        }
}

static void allocate_fill_in(double **A, int kk)
{
    for (int i = kk + 1; i < NB; i++)
        if (A[i * NB + kk])
            for (int j = kk + 1; j < NB; j++)
                if (A[kk * NB + j] && !A[i * NB + j])
                    A[i * NB + j] = new_block();
}

static void lu_sequential(double **A)
{
    for (int kk = 0; kk < NB; kk++) {
        lu0(A[kk * NB + kk]);
        for (int j = kk + 1; j < NB; j++)
            if (A[kk * NB + j])
                fwd(A[kk * NB + kk], A[kk * NB + j]);
        for (int i = kk + 1; i < NB; i++)
            if (A[i * NB + kk])
                bdiv(A[kk * NB + kk], A[i * NB + kk]);
        allocate_fill_in(A, kk);
        for (int i = kk + 1; i < NB; i++)
            if (A[i * NB + kk])
                for (int j = kk + 1; j < NB; j++)
                    if (A[kk * NB + j])
                        bmod(A[i * NB + kk], A[kk * NB + j], A[i * NB + j]);
    }
}

#ifndef FOR_VERSION
static void lu_tasks(double **A)
{
#pragma omp parallel
#pragma omp single
    for (int kk = 0; kk < NB; kk++) {
        lu0(A[kk * NB + kk]);
        for (int j = kk + 1; j < NB; j++)
            if (A[kk * NB + j]) {
#pragma omp task untied firstprivate(kk, j) shared(A)
                fwd(A[kk * NB + kk], A[kk * NB + j]);
            }
        for (int i = kk + 1; i < NB; i++)
            if (A[i * NB + kk]) {
#pragma omp task untied firstprivate(kk, i) shared(A)
                bdiv(A[kk * NB + kk], A[i * NB + kk]);
            }
#pragma omp taskwait
        allocate_fill_in(A, kk);
        for (int i = kk + 1; i < NB; i++)
            if (A[i * NB + kk])
                for (int j = kk + 1; j < NB; j++)
                    if (A[kk * NB + j]) {
#pragma omp task untied firstprivate(kk, i, j) shared(A)
                        bmod(A[i * NB + kk], A[kk * NB + j], A[i * NB + j]);
                    }
#pragma omp taskwait
    }
}
#else
static void lu_tasks(double **A)
{
#pragma omp parallel
    for (int kk = 0; kk < NB; kk++) {
#pragma omp single
        lu0(A[kk * NB + kk]);
#pragma omp for schedule(dynamic)
        for (int j = kk + 1; j < NB; j++)
            if (A[kk * NB + j]) {
#pragma omp task untied firstprivate(kk, j) shared(A)
                fwd(A[kk * NB + kk], A[kk * NB + j]);
            }
#pragma omp for schedule(dynamic)
        for (int i = kk + 1; i < NB; i++)
            if (A[i * NB + kk]) {
#pragma omp task untied firstprivate(kk, i) shared(A)
                bdiv(A[kk * NB + kk], A[i * NB + kk]);
            }
#pragma omp single
        allocate_fill_in(A, kk);
#pragma omp for schedule(dynamic)
        for (int i = kk + 1; i < NB; i++)
            if (A[i * NB + kk])
                for (int j = kk + 1; j < NB; j++)
                    if (A[kk * NB + j]) {
#pragma omp task untied firstprivate(kk, i, j) shared(A)
                        bmod(A[i * NB + kk], A[kk * NB + j], A[i * NB + j]);
                    }
    }
}
#endif

static int same(double **A, double **B)
{
    for (int k = 0; k < NB * NB; k++) {
        if (!A[k] != !B[k])
            return 0;
        if (!A[k])
            continue;
        for (int e = 0; e < BS * BS; e++) {
            double a = A[k][e], b = B[k][e];
            if (!(fabs(a - b) <= 1e-9 * (1.0 + fabs(b))))
                return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv)
{
    opt.n = 50;
    opt.m = 100;
    parse_args(argc, argv);
    if (opt.n < 1 || opt.m < 1) {
        fprintf(stdout, "Error: bad sizes\n");
        return 101;
    }
    NB = (int)opt.n;
    BS = (int)opt.m;
#ifdef FOR_VERSION
    init_run("SparseLU (For version)");
#else
    init_run("SparseLU (Single version)");
#endif
    snprintf(run.parameters, sizeof run.parameters, "S1=%dx%d, S2=%dx%d", NB, NB, BS, BS);
    double **A = make_matrix();
    double **ref = opt.check ? copy_matrix(A) : NULL;
    message("Computing SparseLU Factorization (%dx%d matrix with %dx%d blocks) ", NB, NB, BS, BS);
    double t0 = wall_now();
    lu_tasks(A);
    run.time_program = wall_now() - t0;
    message(" completed!\n");
    if (fault_is("bad"))
        A[0][0] += 1.0;
    after_kernel();
    if (opt.check) {
        t0 = wall_now();
        lu_sequential(ref);
        run.time_sequential = wall_now() - t0;
        run.seq_ran = 1;
        run.result = same(A, ref) ? RES_OK : RES_BAD;
        free_matrix(ref);
    }
    print_results();
    free_matrix(A);
    return 0;
}
