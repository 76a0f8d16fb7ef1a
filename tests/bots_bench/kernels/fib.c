/*
 * hidvfs test kernel "fib": Fibonacci by binary task recursion (two tasks and a taskwait per
 * call). Built as fib.gcc.omp-tasks, and with -DMANUAL_CUTOFF as fib.gcc.omp-tasks-manual
 * (recursion below depth -x runs serially). -c checks against an iterative recomputation.
 */
#ifdef MANUAL_CUTOFF
#define KERNEL_FLAGS "nx"
#else
#define KERNEL_FLAGS "n"
#endif
#include "harness.h"

#ifdef MANUAL_CUTOFF
static long fib_serial(int n) { return n < 2 ? n : fib_serial(n - 1) + fib_serial(n - 2); }
#endif

static long fib_tasks(int n, int depth)
{
    long x, y;
    if (n < 2)
        return n;
#ifdef MANUAL_CUTOFF
    if (depth >= opt.cutoff)
        return fib_serial(n);
#endif
#pragma omp task untied shared(x) firstprivate(n, depth)
    x = fib_tasks(n - 1, depth + 1);
#pragma omp task untied shared(y) firstprivate(n, depth)
    y = fib_tasks(n - 2, depth + 1);
#pragma omp taskwait
    return x + y;
}

static long fib_iterative(int n)
{
    long a = 0, b = 1;
    for (int i = 0; i < n; i++) {
        long t = a + b;
        a = b;
        b = t;
    }
    return a;
}

int main(int argc, char **argv)
{
    long result = 0;
    double t0;
    opt.n = 10;
    opt.cutoff = 10;
    parse_args(argc, argv);
    init_run("Fibonacci");
    snprintf(run.parameters, sizeof run.parameters, "N=%ld", opt.n);
#ifdef MANUAL_CUTOFF
    snprintf(run.cutoff, sizeof run.cutoff, "manual (%d)", opt.cutoff);
#endif
    message("Computing Fibonacci(%ld) with tasks ", opt.n);
    t0 = wall_now();
#pragma omp parallel
#pragma omp single
    result = fib_tasks((int)opt.n, 0);
    run.time_program = wall_now() - t0;
    message("completed!");
    message("\nFibonacci result for %ld is %ld\n", opt.n, result);
    if (fault_is("bad"))
        result += 1;
    after_kernel();
    if (opt.check)
        run.result = result == fib_iterative((int)opt.n) ? RES_OK : RES_BAD;
    print_results();
    return 0;
}
