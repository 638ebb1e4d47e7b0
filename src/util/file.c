/* file.c: read-only mappings, whole-file reads and atomic (temp + fsync + rename) writes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

qf_status qf_map_file(const char *path, qf_mapped_file *mf, qf_error *err) {
    memset(mf, 0, sizeof *mf);
    snprintf(mf->path, sizeof mf->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return qf_fail(err, QF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return qf_fail(err, QF_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return qf_fail(err, QF_ERR_IO, "%s: not a regular file", path);
    }
    mf->size = (size_t)st.st_size;
    if (mf->size > 0) {
        void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            if (e == ENOMEM) /* the address-space limit (ulimit -v), not the file */
                return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory mapping %zu bytes (address-space limit?)",
                               path, mf->size);
            return qf_fail(err, QF_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
        mf->data = p;
    }
    close(fd);
    return QF_OK;
}

void qf_unmap_file(qf_mapped_file *mf) {
    if (mf->data && mf->size) munmap((void *)mf->data, mf->size);
    mf->data = NULL;
    mf->size = 0;
}

qf_status qf_read_file(const char *path, char **out, size_t *len, qf_error *err) {
    *out = NULL;
    *len = 0;
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *fp = is_stdin ? stdin : fopen(path, "rb");
    if (!fp) return qf_fail(err, QF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (!is_stdin && fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(fp);
        return qf_fail(err, QF_ERR_IO, "%s: is a directory (expected a file)", path);
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        if (!is_stdin) fclose(fp);
        return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                if (!is_stdin) fclose(fp);
                return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
    }
    bool bad = ferror(fp);
    if (!is_stdin) fclose(fp);
    if (bad) {
        int e = errno;
        free(buf);
        return qf_fail(err, QF_ERR_IO, "%s: read error: %s", path, strerror(e));
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return QF_OK;
}

/* ---- temp-file registry and signal cleanup ---- */

#define TEMP_SLOTS 64
static struct {
    volatile sig_atomic_t used;
    char path[4200];
} temp_slots[TEMP_SLOTS];
static pthread_mutex_t temp_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t temp_once = PTHREAD_ONCE_INIT;
static const int temp_signals[] = {SIGINT, SIGTERM, SIGHUP};

/* async-signal-safe: unlink the registered files, then die of the signal as we would have */
static void temp_on_signal(int sig) {
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (temp_slots[i].used) unlink(temp_slots[i].path);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void temp_install(void) {
    for (size_t i = 0; i < sizeof temp_signals / sizeof temp_signals[0]; i++) {
        struct sigaction old;
        if (sigaction(temp_signals[i], NULL, &old) != 0) continue;
        if (old.sa_handler != SIG_DFL) continue; /* ignored (nohup) or the program's own handler */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = temp_on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(temp_signals[i], &sa, NULL);
    }
}

/* Register path for removal on a signal; silently not registered when all slots are taken. */
static void temp_register(const char *path) {
    pthread_once(&temp_once, temp_install);
    pthread_mutex_lock(&temp_mu);
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (!temp_slots[i].used) {
            snprintf(temp_slots[i].path, sizeof temp_slots[i].path, "%s", path);
            __atomic_store_n(&temp_slots[i].used, 1, __ATOMIC_SEQ_CST);
            break;
        }
    pthread_mutex_unlock(&temp_mu);
}

static void temp_unregister(const char *path) {
    pthread_mutex_lock(&temp_mu);
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (temp_slots[i].used && strcmp(temp_slots[i].path, path) == 0) {
            __atomic_store_n(&temp_slots[i].used, 0, __ATOMIC_SEQ_CST);
            break;
        }
    pthread_mutex_unlock(&temp_mu);
}

/* Whether process pid is gone (it cannot have a temp file being written any more). */
static bool pid_dead(long pid) {
    if (pid <= 0 || pid == (long)getpid()) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* In directory dir, unlink entries named <stem><pid><rest> whose pid is dead; rest must be
 * empty or start with sep (sep 0: must be empty). */
static void sweep_dir(const char *dir, const char *stem, char sep) {
    DIR *d = opendir(dir);
    if (!d) return;
    size_t n = strlen(stem);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, stem, n) != 0) continue;
        char *end;
        errno = 0;
        long pid = strtol(de->d_name + n, &end, 10);
        if (errno || end == de->d_name + n || (*end && *end != sep) || (*end && !sep)) continue;
        if (!pid_dead(pid)) continue;
        char p[4096 + 256];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
}

static const char *temp_dir(void) {
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

qf_status qf_temp_create(const char *prefix, char *path, size_t cap, qf_error *err) {
    const char *dir = temp_dir();
    char stem[256];
    snprintf(stem, sizeof stem, "%s-", prefix);
    sweep_dir(dir, stem, '-');
    if ((size_t)snprintf(path, cap, "%s/%s-%ld-XXXXXX", dir, prefix, (long)getpid()) >= cap)
        return qf_fail(err, QF_ERR_IO, "%s: temp directory path too long", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        int e = errno;
        path[0] = 0;
        return qf_fail(err, QF_ERR_IO, "cannot create a temporary file in %s: %s", dir, strerror(e));
    }
    close(fd);
    temp_register(path);
    return QF_OK;
}

void qf_temp_remove(const char *path) {
    if (!path || !path[0]) return;
    unlink(path);
    temp_unregister(path);
}

qf_status qf_atomic_open(qf_atomic_file *af, const char *path, qf_error *err) {
    memset(af, 0, sizeof *af);
    snprintf(af->path, sizeof af->path, "%s", path);
    snprintf(af->tmp_path, sizeof af->tmp_path, "%s.tmp.%ld", path, (long)getpid());
    { /* sweep "<path>.tmp.<pid>" left by a process that died (kill -9) */
        char d[4096], b[4096], stem[4200];
        snprintf(d, sizeof d, "%s", path);
        snprintf(b, sizeof b, "%s", path);
        snprintf(stem, sizeof stem, "%s.tmp.", basename(b));
        sweep_dir(dirname(d), stem, 0);
    }
    temp_register(af->tmp_path);
    int fd = open(af->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        temp_unregister(af->tmp_path);
        return qf_fail(err, QF_ERR_IO, "%s: cannot create temp file %s: %s", path, af->tmp_path,
                       strerror(e));
    }
    af->fp = fdopen(fd, "wb");
    if (!af->fp) {
        close(fd);
        unlink(af->tmp_path);
        temp_unregister(af->tmp_path);
        return qf_fail(err, QF_ERR_IO, "%s: fdopen failed", path);
    }
    return QF_OK;
}

qf_status qf_atomic_write(qf_atomic_file *af, const void *buf, size_t n, qf_error *err) {
    if (!af->fp) return qf_fail(err, QF_ERR_IO, "%s: write after close", af->path);
    if (n && fwrite(buf, 1, n, af->fp) != n) {
        int e = errno;
        qf_atomic_abort(af);
        return qf_fail(err, QF_ERR_IO, "%s: write failed: %s (nothing was written)", af->path,
                       strerror(e));
    }
    return QF_OK;
}

static void fsync_parent_dir(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    int dfd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

qf_status qf_atomic_commit(qf_atomic_file *af, qf_error *err) {
    if (!af->fp) return qf_fail(err, QF_ERR_IO, "%s: commit after close", af->path);
    int e = 0;
    if (fflush(af->fp) != 0) e = errno;
    if (!e && fsync(fileno(af->fp)) != 0) e = errno;
    if (fclose(af->fp) != 0 && !e) e = errno;
    af->fp = NULL;
    if (e) {
        unlink(af->tmp_path);
        temp_unregister(af->tmp_path);
        return qf_fail(err, QF_ERR_IO, "%s: write failed: %s (nothing was written)", af->path,
                       strerror(e));
    }
    if (rename(af->tmp_path, af->path) != 0) {
        e = errno;
        unlink(af->tmp_path);
        temp_unregister(af->tmp_path);
        return qf_fail(err, QF_ERR_IO, "%s: rename failed: %s", af->path, strerror(e));
    }
    temp_unregister(af->tmp_path);
    fsync_parent_dir(af->path);
    return QF_OK;
}

void qf_atomic_abort(qf_atomic_file *af) {
    if (af->fp) {
        fclose(af->fp);
        af->fp = NULL;
    }
    if (af->tmp_path[0]) {
        unlink(af->tmp_path);
        temp_unregister(af->tmp_path);
    }
}

qf_status qf_write_file_atomic(const char *path, const void *buf, size_t n, qf_error *err) {
    qf_atomic_file af;
    qf_status st = qf_atomic_open(&af, path, err);
    if (st) return st;
    if ((st = qf_atomic_write(&af, buf, n, err))) return st;
    return qf_atomic_commit(&af, err);
}

void *qf_malloc_aligned(size_t n) {
    void *p = NULL;
    if (n == 0) n = 64;
    if (posix_memalign(&p, 64, (n + 63) & ~(size_t)63) != 0) return NULL;
    return p;
}

/* realpath of path's directory + "/" + its last component into out; false when the directory
 * does not resolve. */
static bool canonical_path(const char *path, char *out, size_t cap) {
    char d[4096], b[4096], rd[PATH_MAX];
    snprintf(d, sizeof d, "%s", path);
    snprintf(b, sizeof b, "%s", path);
    const char *base = basename(b);
    if (!realpath(dirname(d), rd)) return false;
    return (size_t)snprintf(out, cap, "%s/%s", strcmp(rd, "/") ? rd : "", base) < cap;
}

bool qf_same_file(const char *a, const char *b) {
    if (!a || !b || !strcmp(a, "-") || !strcmp(b, "-")) return false;
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    if (canonical_path(a, ca, sizeof ca) && canonical_path(b, cb, sizeof cb)) return strcmp(ca, cb) == 0;
    return strcmp(a, b) == 0;
}

qf_status qf_check_writable(const char *path, qf_status code, qf_error *err) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return qf_fail(err, code, "%s: is a directory (expected a file name to write)", path);
    char d[4096];
    snprintf(d, sizeof d, "%s", path);
    const char *dir = dirname(d);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return qf_fail(err, code, "%s: cannot write: the directory %s does not exist", path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return qf_fail(err, code, "%s: cannot write: the directory %s is not writable: %s", path, dir,
                       strerror(errno));
    return QF_OK;
}

qf_status qf_check_outputs(const char *const *ins, const char *const *in_names, int n_in,
                           const char *const *outs, const char *const *out_names, int n_out, qf_error *err) {
    for (int i = 0; i < n_out; i++) {
        if (!outs[i]) continue;
        for (int j = 0; j < n_in; j++)
            if (ins[j] && qf_same_file(outs[i], ins[j]))
                return qf_fail(err, QF_ERR_ARG, "%s %s is the input %s %s: refusing to overwrite an input",
                               out_names[i], outs[i], in_names[j], ins[j]);
        for (int j = 0; j < i; j++)
            if (outs[j] && qf_same_file(outs[i], outs[j]))
                return qf_fail(err, QF_ERR_ARG, "%s %s and %s %s are the same file: one would replace the other",
                               out_names[j], outs[j], out_names[i], outs[i]);
    }
    return QF_OK;
}
