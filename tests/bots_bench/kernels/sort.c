/*
 * hidvfs test kernel "sort": task-parallel merge sort of pseudo-random integers. A range is
 * split in four sorted quarters (four tasks + taskwait), merged pairwise (two tasks), then
 * merged once more; each merge is itself a recursive two-task merge down to -y elements.
 * Leaves below -a elements use the C library's qsort, below -b an insertion sort.
 * -c checks order and that the multiset (count, sum, xor) is unchanged.
 */
#define KERNEL_FLAGS "nyab"
#include "harness.h"

typedef long long elem;

static int cmp_elem(const void *p, const void *q)
{
    elem a = *(const elem *)p, b = *(const elem *)q;
    return (a > b) - (a < b);
}

static void insertion(elem *a, long n)
{
    for (long i = 1; i < n; i++) {
        elem v = a[i];
        long j = i - 1;
        while (j >= 0 && a[j] > v) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
}

static void leaf_sort(elem *a, long n)
{
    if (n <= opt.b)
        insertion(a, n);
    else
        qsort(a, (size_t)n, sizeof(elem), cmp_elem);
}

/* first index in a[0..n) whose value is >= v */
static long lower_bound(const elem *a, long n, elem v)
{
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* merge sorted a[0..na) and b[0..nb) into out */
static void merge(const elem *a, long na, const elem *b, long nb, elem *out)
{
    if (na < nb) {
        const elem *t = a; a = b; b = t;
        long tn = na; na = nb; nb = tn;
    }
    if (na + nb <= opt.y || nb == 0) {
        long i = 0, j = 0, k = 0;
        while (i < na && j < nb)
            out[k++] = (b[j] < a[i]) ? b[j++] : a[i++];
        while (i < na) out[k++] = a[i++];
        while (j < nb) out[k++] = b[j++];
        return;
    }
    long ma = na / 2;
    long mb = lower_bound(b, nb, a[ma]);
#pragma omp task untied
    merge(a, ma, b, mb, out);
#pragma omp task untied
    merge(a + ma, na - ma, b + mb, nb - mb, out + ma + mb);
#pragma omp taskwait
}

/* sort a[0..n) using tmp[0..n) as scratch; the result ends in a */
static void sort_tasks(elem *a, elem *tmp, long n)
{
    if (n <= opt.a) {
        leaf_sort(a, n);
        return;
    }
    long q = n / 4;
    elem *a1 = a, *a2 = a + q, *a3 = a + 2 * q, *a4 = a + 3 * q;
    elem *t1 = tmp, *t2 = tmp + q, *t3 = tmp + 2 * q, *t4 = tmp + 3 * q;
#pragma omp task untied
    sort_tasks(a1, t1, q);
#pragma omp task untied
    sort_tasks(a2, t2, q);
#pragma omp task untied
    sort_tasks(a3, t3, q);
#pragma omp task untied
    sort_tasks(a4, t4, n - 3 * q);
#pragma omp taskwait
#pragma omp task untied
    merge(a1, q, a2, q, t1);
#pragma omp task untied
    merge(a3, q, a4, n - 3 * q, t3);
#pragma omp taskwait
    merge(t1, 2 * q, t3, n - 2 * q, a);
}

int main(int argc, char **argv)
{
    opt.n = 1 << 20;
    opt.y = 2048;
    opt.a = 2048;
    opt.b = 20;
    parse_args(argc, argv);
    if (opt.n < 4 || opt.a < 4 || opt.b < 1 || opt.y < 2) {
        fprintf(stdout, "Error: bad sizes\n");
        return 101;
    }
    init_run("Sort");
    snprintf(run.parameters, sizeof run.parameters, "N=%ld:Q=%d:I=%d:M=%d", opt.n, opt.a, opt.b,
             opt.y);
    elem *a = malloc(sizeof(elem) * (size_t)opt.n), *tmp = malloc(sizeof(elem) * (size_t)opt.n);
    if (!a || !tmp) {
        fprintf(stdout, "Error: out of memory\n");
        return 102;
    }
    unsigned long long s = 0x9E3779B97F4A7C15ull, sum = 0, xr = 0;
    for (long i = 0; i < opt.n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = (elem)(s >> 33);
        sum += (unsigned long long)a[i];
        xr ^= (unsigned long long)a[i];
    }
    message("Computing multisort algorithm (n=%ld) ", opt.n);
    double t0 = wall_now();
#pragma omp parallel
#pragma omp single
    sort_tasks(a, tmp, opt.n);
    run.time_program = wall_now() - t0;
    message(" completed!\n");
    if (fault_is("bad")) {
        elem t = a[0]; a[0] = a[opt.n - 1]; a[opt.n - 1] = t;
    }
    after_kernel();
    if (opt.check) {
        int ok = 1;
        unsigned long long sum2 = 0, xr2 = 0;
        for (long i = 0; i < opt.n; i++) {
            if (i > 0 && a[i - 1] > a[i])
                ok = 0;
            sum2 += (unsigned long long)a[i];
            xr2 ^= (unsigned long long)a[i];
        }
        run.result = (ok && sum2 == sum && xr2 == xr) ? RES_OK : RES_BAD;
    }
    print_results();
    free(a);
    free(tmp);
    return 0;
}
