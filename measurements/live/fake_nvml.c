// A stand-in libnvidia-ml.so.1 for measuring gpumem-top's own cost and
// profiling it without a GPU (measurements/live/local_cost.py): one H200-sized GPU
// with one process, FAKE_NVML_PID, holding 17.4 GiB.
#include <stdlib.h>
#include <string.h>
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem2;
typedef struct { unsigned int gpu, memory; } util;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc3;
static int dummy;
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned int f) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return "fake error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { if (i) return 2; *h = &dummy; return 0; }
int nvmlDeviceGetName(void *h, char *name, unsigned int len) { strncpy(name, "NVIDIA H200", len); return 0; }
int nvmlDeviceGetUUID(void *h, char *u, unsigned int len) { strncpy(u, "GPU-00000000-0000-0000-0000-000000000000", len); return 0; }
int nvmlDeviceGetMemoryInfo_v2(void *h, mem2 *m) { m->total = 150754820096ULL; m->used = 20128858112ULL; m->free = m->total - m->used; m->reserved = 0; return 0; }
int nvmlDeviceGetUtilizationRates(void *h, util *u) { u->gpu = 97; u->memory = 40; return 0; }
int nvmlDeviceGetMigMode(void *h, unsigned int *cur, unsigned int *pend) { return 3; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, proc3 *p) {
    const char *e = getenv("FAKE_NVML_PID");
    unsigned int n = e ? 1 : 0;
    if (!p) { if (n > *count) { *count = n; return 7; } *count = n; return 0; }
    if (*count < n) { *count = n; return 7; }
    *count = n;
    if (n) { p[0].pid = atoi(e); p[0].used = 18660458496ULL; p[0].gi = p[0].ci = 0xFFFFFFFF; }
    return 0;
}
