/* What memory this process's node can give: the kernel's MemAvailable,
 * capped by the cgroup v2 limit the process runs under. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/base.h"

static int64_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

static int64_t read_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || !strncmp(buf, "max", 3)) return -1;
    char *end;
    long long v = strtoll(buf, &end, 10);
    return end == buf ? -1 : (int64_t)v;
}

int64_t hs_memory_available(void) {
    const char *env = getenv("HYPERSHARD_NODE_MEMORY");
    if (env && env[0]) {
        char *end;
        long long v = strtoll(env, &end, 10);
        if (end != env && *end == '\0' && v > 0) return (int64_t)v;
    }
    int64_t avail = meminfo_available();
    int64_t limit = read_number("/sys/fs/cgroup/memory.max");
    int64_t used = read_number("/sys/fs/cgroup/memory.current");
    if (limit > 0 && used >= 0 && (avail < 0 || limit - used < avail)) avail = limit - used;
    return avail;
}
