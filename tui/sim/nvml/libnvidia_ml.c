/* A stand-in for the NVML C library (libnvidia-ml.so.1): simulated GPUs that exist only as files.
 *
 * The real nvidia-ml-py binding loads it with CDLL("libnvidia-ml.so.1") when its directory is on
 * LD_LIBRARY_PATH, so the agent's sampling runs through the real binding, its ctypes structs and
 * its error classes. It reads the same state directory as tui/sim/fakenvml/pynvml.py, with the
 * same meaning (the writer is tui/sim/gpu_state.py):
 *
 *   $SPECCONSOLE_SIM_GPU_STATE (default ~/.specconsole/sim-gpus), read at nvmlInit:
 *   devices.json       {"count","name","total"}; missing: NVML_ERROR_DRIVER_NOT_LOADED
 *   holder-<pid>.json  {"pid","gpu","used","util","pidns"}, counted only while the pid is alive
 *                      and not a zombie (/proc/<pid>/stat); a dead holder's file is deleted on
 *                      the way. "pidns": the inode of the writer's pid namespace; a holder in
 *                      a container wrote its pid there, and is reported by its host pid (what
 *                      a real driver reports): the process in that namespace whose innermost
 *                      NSpid it is
 *
 * Faults, so tests can prove the agent's behaviour against the real binding:
 *   -DOMIT_<symbol>                          build without that function (an old driver)
 *   lost-<index> in the state directory      that device answers NVML_ERROR_GPU_IS_LOST from
 *                                            then on (it fell off the bus)
 *   SPECCONSOLE_SIM_NVML_FAULT=version_mismatch
 *                                            nvmlInit* answers NVML_ERROR_LIB_RM_VERSION_MISMATCH
 *
 * Plain C99 + POSIX, libc only. Built by tui/sim/nvml/build.py.
 */

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NVML_API __attribute__((visibility("default")))

/* ---- NVML's types, as nvml.h and nvidia-ml-py's ctypes structs lay them out ---- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st { unsigned int index; } *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(sizeof(size) | ((ver) << 24U)))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(nvmlMemory_v2_t, 2) /* 0x02000028 */

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct { /* the unversioned functions' layout */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct { /* _v2 and _v3 (nvidia-ml-py: c_nvmlProcessInfo_v2_t == _v3_t) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

#define NO_INSTANCE 0xFFFFFFFFU
#define DRIVER_VERSION "550.54.15"
#define NVML_VERSION "12.550.54.15"
#define MAX_DEVICES 64
#define MAX_HOLDERS 1024
#define SCAN_TTL_NS 100000000LL /* one sample of all devices reads the directory once */

/* ---- state: what nvmlInit read, and the last scan of holders ---- */

typedef struct {
    int pid, gpu, util;
    unsigned long long used;
} holder_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refs;                       /* nvmlInit counts references, nvmlShutdown releases */
static char state_dir[PATH_MAX - 512]; /* room left for a file name inside it */
static unsigned int dev_count;
static char dev_name[96];
static unsigned long long dev_total;
static struct nvmlDevice_st devices[MAX_DEVICES];
static int lost[MAX_DEVICES];          /* sticky: a GPU off the bus stays off until a reboot */
static holder_t holders[MAX_HOLDERS];
static int holder_count;
static long long scanned_at = -1;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- a tiny parser for flat JSON objects: string, number, true/false/null values ---- */

typedef struct {
    const char *p, *end;
} cursor_t;

static void skip_ws(cursor_t *c) {
    while (c->p < c->end && isspace((unsigned char)*c->p)) c->p++;
}

static int hex4(const char *p, unsigned int *out) {
    unsigned int v = 0;
    for (int i = 0; i < 4; i++) {
        int ch = (unsigned char)p[i], d;
        if (ch >= '0' && ch <= '9') d = ch - '0';
        else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
        else return -1;
        v = v * 16 + (unsigned int)d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *out, size_t room, unsigned int cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) { b[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { b[0] = (char)(0xC0 | cp >> 6); b[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12); b[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        b[0] = (char)(0xF0 | cp >> 18); b[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        b[2] = (char)(0x80 | (cp >> 6 & 0x3F)); b[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    if (n > room) return 0;
    memcpy(out, b, n);
    return n;
}

/* A JSON string at the cursor into out (NUL-terminated, truncated to size); -1 if malformed. */
static int parse_string(cursor_t *c, char *out, size_t size) {
    size_t n = 0;
    if (c->p >= c->end || *c->p != '"') return -1;
    c->p++;
    while (c->p < c->end && *c->p != '"') {
        unsigned int cp = (unsigned char)*c->p++;
        if (cp == '\\') {
            if (c->p >= c->end) return -1;
            char e = *c->p++;
            switch (e) {
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (c->end - c->p < 4 || hex4(c->p, &cp)) return -1;
                c->p += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && c->end - c->p >= 6 && c->p[0] == '\\'
                    && c->p[1] == 'u') {
                    unsigned int lo;
                    if (!hex4(c->p + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        c->p += 6;
                    }
                }
                break;
            default: cp = (unsigned char)e; /* \" \\ \/ */
            }
            if (out && size) n += put_utf8(out + n, size - 1 - n, cp);
        } else if (out && size && n + 1 < size) {
            out[n++] = (char)cp;
        }
    }
    if (c->p >= c->end) return -1;
    c->p++;
    if (out && size) out[n] = '\0';
    return 0;
}

/* A scalar value as Python's int() would take it: a number (truncated), a numeric string,
 * true/false; *ok is 0 for anything else (null, a word, a nested value). */
static int parse_scalar(cursor_t *c, long long *num, int *ok, char *str, size_t size) {
    *ok = 0;
    if (str && size) str[0] = '\0';
    if (c->p >= c->end) return -1;
    if (*c->p == '"') {
        char buf[64];
        if (parse_string(c, str ? str : buf, str ? size : sizeof buf)) return -1;
        const char *s = str ? str : buf;
        char *endp;
        errno = 0;
        *num = strtoll(s, &endp, 10);
        while (*endp && isspace((unsigned char)*endp)) endp++;
        *ok = endp != s && !*endp && !errno;
        return 0;
    }
    if (*c->p == '{' || *c->p == '[') return -1; /* flat objects only */
    const char *start = c->p;
    while (c->p < c->end && !strchr(",}] \t\r\n", *c->p)) c->p++;
    size_t len = (size_t)(c->p - start);
    char tok[64];
    if (len == 0 || len >= sizeof tok) return -1;
    memcpy(tok, start, len);
    tok[len] = '\0';
    if (str && size) snprintf(str, size, "%s", tok);
    if (!strcmp(tok, "true") || !strcmp(tok, "false")) {
        *num = tok[0] == 't';
        *ok = 1;
    } else if (strcmp(tok, "null")) {
        char *endp;
        double d = strtod(tok, &endp);
        *ok = !*endp && d > -9.2e18 && d < 9.2e18;
        *num = *ok ? (long long)d : 0;
        if (*ok && !strpbrk(tok, ".eE")) *num = strtoll(tok, NULL, 10); /* exact above 2^53 */
    }
    return 0;
}

typedef struct {
    const char *key;
    long long num;
    int found, ok;
    char *str;
    size_t size;
} field_t;

/* Parse one flat object, filling the fields named; -1 if it is not one. */
static int parse_object(const char *text, size_t len, field_t *fields, int nfields) {
    cursor_t c = {text, text + len};
    char key[64];
    skip_ws(&c);
    if (c.p >= c.end || *c.p++ != '{') return -1;
    skip_ws(&c);
    if (c.p < c.end && *c.p == '}') return 0;
    for (;;) {
        skip_ws(&c);
        if (parse_string(&c, key, sizeof key)) return -1;
        skip_ws(&c);
        if (c.p >= c.end || *c.p++ != ':') return -1;
        skip_ws(&c);
        field_t *f = NULL;
        for (int i = 0; i < nfields; i++)
            if (!strcmp(fields[i].key, key)) f = &fields[i];
        long long num = 0;
        int ok = 0;
        if (parse_scalar(&c, &num, &ok, f ? f->str : NULL, f ? f->size : 0)) return -1;
        if (f) {
            f->found = 1;
            f->ok = ok;
            f->num = num;
        }
        skip_ws(&c);
        if (c.p >= c.end) return -1;
        if (*c.p == '}') return 0;
        if (*c.p++ != ',') return -1;
    }
}

/* A whole small file into buf (NUL-terminated); its length, or -1. */
static long read_file(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t r = read(fd, buf + n, size - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    return (long)n;
}

/* ---- the simulated machine ---- */

/* $SPECCONSOLE_SIM_GPU_STATE, else ~/.specconsole/sim-gpus, `~` expanded, made absolute as
 * os.path.abspath does; -1 when it would not fit. */
static int resolve_state_dir(char *out, size_t size) {
    const char *env = getenv("SPECCONSOLE_SIM_GPU_STATE");
    const char *home = getenv("HOME");
    const char *path = env && *env ? env : "~/.specconsole/sim-gpus";
    char cwd[PATH_MAX];
    int n;
    if (path[0] == '~' && (path[1] == '/' || path[1] == '\0') && home)
        n = snprintf(out, size, "%s%s", home, path + 1);
    else if (path[0] != '/' && getcwd(cwd, sizeof cwd))
        n = snprintf(out, size, "%s/%s", cwd, path);
    else
        n = snprintf(out, size, "%s", path);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static void mkdirs(const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0777);
            *p = '/';
        }
    }
    mkdir(path, 0777);
}

/* SPECCONSOLE_SIM_GPUS=N makes the simulated machine have N GPUs before any engine ran (the
 * agent's preflight asks NVML before the first launch), as the Python fake does. */
static void create_devices_if_asked(const char *dir) {
    const char *count = getenv("SPECCONSOLE_SIM_GPUS");
    char path[PATH_MAX], tmp[PATH_MAX];
    struct stat st;
    if (!count || !*count) return;
    snprintf(path, sizeof path, "%s/devices.json", dir);
    if (stat(path, &st) == 0) return;
    char *endp;
    long n = strtol(count, &endp, 10);
    if (*endp || endp == count) return;
    mkdirs(dir);
    snprintf(tmp, sizeof tmp, "%s/.devices.json.%d.tmp", dir, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "{\"count\": %ld, \"name\": \"NVIDIA H200 (simulated)\", \"total\": %llu}", n,
            143771ULL * 1024 * 1024);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

static nvmlReturn_t load_devices(void) {
    char buf[65536], path[PATH_MAX];
    char name[sizeof dev_name];
    field_t f[] = {{"count", 0, 0, 0, NULL, 0}, {"name", 0, 0, 0, name, sizeof name},
                   {"total", 0, 0, 0, NULL, 0}};
    if (resolve_state_dir(state_dir, sizeof state_dir)) return NVML_ERROR_DRIVER_NOT_LOADED;
    create_devices_if_asked(state_dir);
    snprintf(path, sizeof path, "%s/devices.json", state_dir);
    long len = read_file(path, buf, sizeof buf);
    if (len < 0 || parse_object(buf, (size_t)len, f, 3) || !f[0].ok || !f[1].found || !f[2].ok)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    long long count = f[0].num;
    dev_count = count < 0 ? 0 : count > MAX_DEVICES ? MAX_DEVICES : (unsigned int)count;
    snprintf(dev_name, sizeof dev_name, "%s", name);
    dev_total = f[2].num < 0 ? 0 : (unsigned long long)f[2].num;
    for (unsigned int i = 0; i < MAX_DEVICES; i++) devices[i].index = i;
    scanned_at = -1;
    return NVML_SUCCESS;
}

/* Running and not a zombie: a zombie's memory is already freed by the driver. */
static int alive(int pid) {
    char path[64], buf[1024];
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (read_file(path, buf, sizeof buf) < 0) return 0;
    char *paren = strrchr(buf, ')');
    if (!paren) return 0;
    paren++;
    while (*paren == ' ') paren++;
    return *paren && *paren != 'Z' && *paren != 'X' && *paren != 'x';
}

/* The host's pid of the process whose pid is `pid` in the pid namespace of inode `ns` (its
 * innermost NSpid); `pid` itself in this process's namespace; 0 when none is alive. */
static int host_pid(int pid, long long ns) {
    struct stat st;
    if (ns <= 0 || (stat("/proc/self/ns/pid", &st) == 0 && (long long)st.st_ino == ns))
        return pid;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    char path[64], buf[4096];
    while (!found && (e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        snprintf(path, sizeof path, "/proc/%s/ns/pid", e->d_name);
        if (stat(path, &st) != 0 || (long long)st.st_ino != ns) continue;
        snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
        if (read_file(path, buf, sizeof buf) < 0) continue;
        char *line = strstr(buf, "\nNSpid:");
        if (!line) continue;
        char *end = strchr(line + 1, '\n');
        if (end) *end = 0;
        char *last = strrchr(line, '\t');
        char *space = strrchr(line, ' ');
        if (space > last) last = space;
        if (last && atoi(last + 1) == pid) found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}

static int by_pid(const void *a, const void *b) {
    int x = ((const holder_t *)a)->pid, y = ((const holder_t *)b)->pid;
    return (x > y) - (x < y);
}

/* Every live holder; files of dead processes are deleted on the way. */
static void scan(void) {
    char path[PATH_MAX], buf[4096];
    holder_count = 0;
    DIR *d = opendir(state_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && holder_count < MAX_HOLDERS) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "holder-", 7) || n < 12 || strcmp(e->d_name + n - 5, ".json"))
            continue;
        field_t f[] = {{"pid", 0, 0, 0, NULL, 0}, {"gpu", 0, 0, 0, NULL, 0},
                       {"used", 0, 0, 0, NULL, 0}, {"util", 0, 0, 0, NULL, 0},
                       {"pidns", 0, 0, 0, NULL, 0}};
        snprintf(path, sizeof path, "%s/%s", state_dir, e->d_name);
        long len = read_file(path, buf, sizeof buf);
        if (len < 0 || parse_object(buf, (size_t)len, f, 5) || !f[0].ok || !f[1].ok || !f[2].ok
            || !f[3].ok || f[0].num > INT_MAX || f[0].num < INT_MIN)
            continue;
        int pid = host_pid((int)f[0].num, f[4].ok ? f[4].num : 0);
        if (!alive(pid)) {
            unlink(path);
            continue;
        }
        holder_t *h = &holders[holder_count++];
        h->pid = pid;
        h->gpu = f[1].num > INT_MAX || f[1].num < INT_MIN ? -1 : (int)f[1].num;
        h->used = f[2].num < 0 ? 0 : (unsigned long long)f[2].num;
        h->util = f[3].num < 0 ? 0 : f[3].num > 100 ? 100 : (int)f[3].num;
    }
    closedir(d);
    qsort(holders, (size_t)holder_count, sizeof *holders, by_pid);
}

static void fresh_scan(void) {
    long long now = now_ns();
    if (scanned_at < 0 || now - scanned_at > SCAN_TTL_NS) {
        scan();
        scanned_at = now;
    }
}

static int is_lost(unsigned int index) {
    char path[PATH_MAX];
    struct stat st;
    if (!lost[index]) {
        snprintf(path, sizeof path, "%s/lost-%u", state_dir, index);
        lost[index] = stat(path, &st) == 0;
    }
    return lost[index];
}

/* The common preamble of every device call, under the lock: initialised, a handle of ours, the
 * device still on the bus. */
static nvmlReturn_t check(nvmlDevice_t device) {
    if (refs == 0) return NVML_ERROR_UNINITIALIZED;
    if (device < devices || device >= devices + MAX_DEVICES || device->index >= dev_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_lost(device->index)) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t do_init(void) {
    const char *fault = getenv("SPECCONSOLE_SIM_NVML_FAULT");
    nvmlReturn_t ret = NVML_SUCCESS;
    if (fault && !strcmp(fault, "version_mismatch")) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    pthread_mutex_lock(&lock);
    if (refs == 0) ret = load_devices();
    if (ret == NVML_SUCCESS) refs++;
    pthread_mutex_unlock(&lock);
    return ret;
}

static nvmlReturn_t do_count(unsigned int *count) {
    nvmlReturn_t ret = NVML_SUCCESS;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    if (refs == 0) ret = NVML_ERROR_UNINITIALIZED;
    else *count = dev_count;
    pthread_mutex_unlock(&lock);
    return ret;
}

static nvmlReturn_t do_handle(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t ret;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    if (refs == 0) ret = NVML_ERROR_UNINITIALIZED;
    else if (index >= dev_count) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (is_lost(index)) ret = NVML_ERROR_GPU_IS_LOST;
    else {
        *device = &devices[index];
        ret = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

/* used = the live holders' sum (at most the total), util = the busiest holder's. */
static nvmlReturn_t do_usage(nvmlDevice_t device, unsigned long long *used, unsigned int *util) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = check(device);
    if (ret == NVML_SUCCESS) {
        fresh_scan();
        unsigned long long sum = 0;
        unsigned int busiest = 0;
        for (int i = 0; i < holder_count; i++) {
            if (holders[i].gpu != (int)device->index) continue;
            sum += holders[i].used;
            if ((unsigned int)holders[i].util > busiest) busiest = (unsigned int)holders[i].util;
        }
        *used = sum < dev_total ? sum : dev_total;
        *util = busiest;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

/* NVML's two-call protocol: *count too small (the binding first asks with 0 and NULL) answers
 * INSUFFICIENT_SIZE with the count needed; otherwise fill and set *count. `v2` picks the
 * element layout (v1: the unversioned functions'); graphics processes are always none here. */
static nvmlReturn_t do_processes(nvmlDevice_t device, unsigned int *count, void *infos, int v2,
                                 int graphics) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = check(device);
    if (ret == NVML_SUCCESS) {
        unsigned int n = 0;
        if (!graphics) {
            fresh_scan();
            for (int i = 0; i < holder_count; i++) n += holders[i].gpu == (int)device->index;
        }
        if (n > *count) {
            ret = NVML_ERROR_INSUFFICIENT_SIZE;
        } else if (n > 0 && !infos) {
            ret = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            unsigned int k = 0;
            for (int i = 0; i < holder_count && !graphics; i++) {
                if (holders[i].gpu != (int)device->index) continue;
                if (v2) {
                    nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + k;
                    p->pid = (unsigned int)holders[i].pid;
                    p->usedGpuMemory = holders[i].used;
                    p->gpuInstanceId = p->computeInstanceId = NO_INSTANCE;
                } else {
                    nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + k;
                    p->pid = (unsigned int)holders[i].pid;
                    p->usedGpuMemory = holders[i].used;
                }
                k++;
            }
        }
        *count = n;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

/* ---- the exported NVML API; each can be left out with -DOMIT_<name> ---- */

#ifndef OMIT_nvmlInit_v2
NVML_API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
#endif

#ifndef OMIT_nvmlInit
NVML_API nvmlReturn_t nvmlInit(void) { return do_init(); }
#endif

#ifndef OMIT_nvmlInitWithFlags
NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}
#endif

#ifndef OMIT_nvmlShutdown
NVML_API nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refs == 0) ret = NVML_ERROR_UNINITIALIZED;
    else refs--;
    pthread_mutex_unlock(&lock);
    return ret;
}
#endif

#ifndef OMIT_nvmlErrorString
NVML_API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}
#endif

#ifndef OMIT_nvmlSystemGetDriverVersion
NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!refs) return NVML_ERROR_UNINITIALIZED;
    return copy_string(DRIVER_VERSION, version, length);
}
#endif

#ifndef OMIT_nvmlSystemGetNVMLVersion
NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return copy_string(NVML_VERSION, version, length); /* needs no nvmlInit, as the real one */
}
#endif

#ifndef OMIT_nvmlDeviceGetCount_v2
NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return do_count(count); }
#endif

#ifndef OMIT_nvmlDeviceGetCount
NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return do_count(count); }
#endif

#ifndef OMIT_nvmlDeviceGetHandleByIndex_v2
NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return do_handle(index, device);
}
#endif

#ifndef OMIT_nvmlDeviceGetHandleByIndex
NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return do_handle(index, device);
}
#endif

#ifndef OMIT_nvmlDeviceGetName
NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = check(device);
    if (ret == NVML_SUCCESS) ret = copy_string(dev_name, name, length);
    pthread_mutex_unlock(&lock);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetUUID
NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    char value[96];
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = check(device);
    if (ret == NVML_SUCCESS) {
        snprintf(value, sizeof value, "GPU-5151a000-0000-4000-8000-%012x", device->index);
        ret = copy_string(value, uuid, length);
    }
    pthread_mutex_unlock(&lock);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo
NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    unsigned long long used;
    unsigned int util;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = do_usage(device, &used, &util);
    if (ret == NVML_SUCCESS) {
        memory->total = dev_total;
        memory->used = used;
        memory->free = dev_total - used;
    }
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo_v2
NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    unsigned long long used;
    unsigned int util;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t ret = do_usage(device, &used, &util);
    if (ret == NVML_SUCCESS) {
        memory->total = dev_total;
        memory->reserved = 0; /* nothing held back by the simulated driver */
        memory->used = used;
        memory->free = dev_total - used;
    }
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetUtilizationRates
NVML_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                    nvmlUtilization_t *utilization) {
    unsigned long long used;
    unsigned int util;
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = do_usage(device, &used, &util);
    if (ret == NVML_SUCCESS) {
        utilization->gpu = util;
        utilization->memory = util / 2;
    }
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                              unsigned int *count,
                                                              nvmlProcessInfo_v2_t *infos) {
    return do_processes(device, count, infos, 1, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v2
NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                              unsigned int *count,
                                                              nvmlProcessInfo_v2_t *infos) {
    return do_processes(device, count, infos, 1, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses
NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                           unsigned int *count,
                                                           nvmlProcessInfo_v1_t *infos) {
    return do_processes(device, count, infos, 0, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                               unsigned int *count,
                                                               nvmlProcessInfo_v2_t *infos) {
    return do_processes(device, count, infos, 1, 1);
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v2
NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                               unsigned int *count,
                                                               nvmlProcessInfo_v2_t *infos) {
    return do_processes(device, count, infos, 1, 1);
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses
NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
                                                            unsigned int *count,
                                                            nvmlProcessInfo_v1_t *infos) {
    return do_processes(device, count, infos, 0, 1);
}
#endif
