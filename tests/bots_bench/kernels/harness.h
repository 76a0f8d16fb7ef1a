/*
 * Test harness of the hidvfs test kernels: a BOTS-compatible command line and result block.
 *
 * Written for hidvfs from the output format documented in shared/reference/bots.md (sections
 * 4 and 5); no BOTS source is used. Each kernel includes this header once, defines
 * KERNEL_FLAGS (the kernel-specific flags it accepts, e.g. "nm") and fills `run`.
 *
 * Fault injection for runner tests, through the environment variable BOTS_TEST_FAULT:
 *   bad   the kernel corrupts its own result, so a real check prints UNSUCCESSFUL (exit 0)
 *   hang  sleep forever after the kernel (timeout tests)
 *   segv  die by SIGSEGV after the kernel (death-by-signal tests)
 */
#ifndef HIDVFS_TEST_HARNESS_H
#define HIDVFS_TEST_HARNESS_H

#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifndef BUILD_DATE
#define BUILD_DATE "1970/01/01;00:00"
#endif
#ifndef BUILD_CFLAGS
#define BUILD_CFLAGS "-O2"
#endif

enum { RES_NA = 0, RES_OK = 1, RES_BAD = 2, RES_NOT_REQUESTED = 3 };

struct opts {
    long n, m, l;
    int n_set, m_set, l_set;
    int cutoff, cutoff_set;
    int y, a, b;
    const char *file;
    int check, verbose, format, header;
    const char *message;
};

struct run {
    const char *program;
    char parameters[128];
    char model[64];
    char cutoff[64];
    int result;
    double time_program;
    int seq_ran;
    double time_sequential;
    long tasks;
};

static struct opts opt = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0, 1, 1, 0, ""};
static struct run run;

static const char *fault(void)
{
    const char *f = getenv("BOTS_TEST_FAULT");
    return f ? f : "";
}

static int fault_is(const char *name) { return strcmp(fault(), name) == 0; }

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static void message(const char *fmt, ...)
{
    if (opt.verbose < 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

static void usage(const char *argv0)
{
    fprintf(stdout, "Usage: %s [-c] [-v 0|1] [-o 0..4] [-z] [-e message] [-h]", argv0);
    fprintf(stdout, " (kernel flags: %s)\n", KERNEL_FLAGS);
}

static int accepts(char flag) { return strchr(KERNEL_FLAGS, flag) != NULL; }

static long need_long(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stdout, "Error: missing value for %s\n", argv[*i]);
        exit(100);
    }
    char *end = NULL;
    long v = strtol(argv[++*i], &end, 10);
    if (!end || *end) {
        fprintf(stdout, "Error: bad value '%s'\n", argv[*i]);
        exit(100);
    }
    return v;
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == 0 || a[2] != 0)
            goto bad;
        switch (a[1]) {
        case 'c': opt.check = 1; break;
        case 'z': opt.header = 1; break;
        case 'h': usage(argv[0]); exit(100);
        case 'v':
            opt.verbose = (int)need_long(argc, argv, &i);
            if (opt.verbose > 1) {
                fprintf(stdout, "Error: verbose level %d needs a debug build\n", opt.verbose);
                exit(100);
            }
            break;
        case 'o':
            opt.format = (int)need_long(argc, argv, &i);
            if (opt.format < 0 || opt.format > 4) {
                fprintf(stdout, "Error: no valid output format\n");
                exit(100);
            }
            break;
        case 'e':
            if (i + 1 >= argc) goto bad;
            opt.message = argv[++i];
            break;
        case 'f':
            if (!accepts('f') || i + 1 >= argc) goto bad;
            opt.file = argv[++i];
            break;
        case 'n': if (!accepts('n')) goto bad; opt.n = need_long(argc, argv, &i); opt.n_set = 1; break;
        case 'm': if (!accepts('m')) goto bad; opt.m = need_long(argc, argv, &i); opt.m_set = 1; break;
        case 'l': if (!accepts('l')) goto bad; opt.l = need_long(argc, argv, &i); opt.l_set = 1; break;
        case 'x':
            if (!accepts('x')) goto bad;
            opt.cutoff = (int)need_long(argc, argv, &i);
            opt.cutoff_set = 1;
            break;
        case 'y': if (!accepts('y')) goto bad; opt.y = (int)need_long(argc, argv, &i); break;
        case 'a': if (!accepts('a')) goto bad; opt.a = (int)need_long(argc, argv, &i); break;
        case 'b': if (!accepts('b')) goto bad; opt.b = (int)need_long(argc, argv, &i); break;
        default: goto bad;
        }
    }
    return;
bad:
    fprintf(stdout, "Error: Unrecognized parameter.\n");
    usage(argv[0]);
    exit(100);
}

static void after_kernel(void)
{
    if (fault_is("hang")) {
        fflush(stdout);
        for (;;)
            pause();
    }
    if (fault_is("segv")) {
        fflush(stdout);
        raise(SIGSEGV);
    }
}

static void print_results(void)
{
    static const char *names[] = {"n/a", "successful", "UNSUCCESSFUL", "Not requested"};
    char time_prog[32], time_seq[32], speedup[32], nodes[32], nodes_s[32];
    char exec_date[32], arch[160], load[64];
    const char *result = (run.result >= 0 && run.result <= 3) ? names[run.result] : "error";
    struct utsname u;
    double la[3] = {0, 0, 0};
    time_t now = time(NULL);

    snprintf(time_prog, sizeof time_prog, "%f", run.time_program);
    snprintf(time_seq, sizeof time_seq, run.seq_ran ? "%f" : "n/a", run.time_sequential);
    if (run.seq_ran)
        snprintf(speedup, sizeof speedup, "%3.2f", run.time_sequential / run.time_program);
    else
        snprintf(speedup, sizeof speedup, "n/a");
    snprintf(nodes, sizeof nodes, "%3.2f", (double)run.tasks);
    snprintf(nodes_s, sizeof nodes_s, "%3.2f", (double)run.tasks / run.time_program);
    strftime(exec_date, sizeof exec_date, "%Y/%m/%d;%H:%M", gmtime(&now));
    uname(&u);
    snprintf(arch, sizeof arch, "%s-%s;%ld", u.sysname, u.machine, sysconf(_SC_NPROCESSORS_CONF));
    if (getloadavg(la, 3) < 0)
        la[0] = la[1] = la[2] = 0;
    snprintf(load, sizeof load, "%.2f;%.2f;%.2f", la[0], la[1], la[2]);

    if (opt.header && opt.format == 2)
        printf("Benchmark;Parameters;Model;Cutoff;Resources;Result;Time;Sequential;Speed-up;"
               "Nodes;Nodes/Sec;Exec Date;Exec Time;Exec Message;Architecture;Processors;"
               "Load Avg-1;Load Avg-5;Load Avg-15;Comp Date;Comp Time;Comp Message;CC;CFLAGS;"
               "LD;LDFLAGS\n");
    if (opt.header && opt.format == 4)
        printf("Benchmark;Parameters;Model;Cutoff;Resources;Result;Time;Sequential;Speed-up;"
               "Nodes;Nodes/Sec;\n");

    if (opt.format == 1 || opt.format == 3) {
        printf("\n");
        printf("%-20s= %s\n", "Program", run.program);
        printf("%-20s= %s\n", "Parameters", run.parameters);
        printf("%-20s= %s\n", "Model", run.model);
        printf("%-20s= %s\n", "Embedded cut-off", run.cutoff);
        printf("%-20s= %d\n", "# of Threads", omp_get_max_threads());
        printf("%-20s= %s\n", "Verification", result);
        printf("%-20s= %s seconds\n", "Time Program", time_prog);
        if (run.seq_ran) {
            printf("%-20s= %s seconds\n", "Time Sequential", time_seq);
            printf("%-20s= %s\n", "Speed-up", speedup);
        }
        if (run.tasks > 0) {
            printf("%-20s= %s\n", "Nodes", nodes);
            printf("%-20s= %s\n", "Nodes/Sec", nodes_s);
        }
        if (opt.format == 1) {
            printf("%-20s= %s\n", "Execution Date", exec_date);
            printf("%-20s= %s\n", "Execution Message", opt.message);
            printf("%-20s= %s\n", "Architecture", arch);
            printf("%-20s= %s\n", "Load Avg [1:5:15]", load);
            printf("%-20s= %s\n", "Compilation Date", BUILD_DATE);
            printf("%-20s= %s\n", "Compilation Message", "");
            printf("%-20s= %s\n", "Compiler", "gcc -fopenmp");
            printf("%-20s= %s\n", "Compiler Flags", BUILD_CFLAGS);
            printf("%-20s= %s\n", "Linker", "gcc -fopenmp");
            printf("%-20s= %s\n", "Linker Flags", BUILD_CFLAGS);
        }
    } else if (opt.format == 2 || opt.format == 4) {
        printf("%s;%s;%s;%s;%d;%s;", run.program, run.parameters, run.model, run.cutoff,
               omp_get_max_threads(), result);
        printf("%s;%s;%s;%s;%s;", time_prog, time_seq, speedup, nodes, nodes_s);
        if (opt.format == 2)
            printf("%s;%s;%s;%s;%s;;gcc -fopenmp;%s;gcc -fopenmp;%s;", exec_date, opt.message,
                   arch, load, BUILD_DATE, BUILD_CFLAGS, BUILD_CFLAGS);
        printf("\n");
    }
    fflush(stdout);
}

static void init_run(const char *program)
{
    memset(&run, 0, sizeof run);
    run.program = program;
    snprintf(run.model, sizeof run.model, "OpenMP (using tasks)");
    snprintf(run.cutoff, sizeof run.cutoff, "none");
    run.result = RES_NOT_REQUESTED;
}

#endif
