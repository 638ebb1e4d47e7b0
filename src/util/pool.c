/* pool.c: a fixed pthread pool running one parallel-for at a time.
 *
 * A job is (fn, arg) plus a generation counter. Between jobs a worker first spins on the counter
 * for up to POOL_SPIN pause-loops (~50 us), then sleeps on a condition variable; the caller
 * waits for the last worker the same way. Decode issues ~100 jobs per token, a few microseconds
 * of work apart, so the spin catches nearly every job without a futex wake-up (a sleeping
 * worker costs the caller a syscall and the worker a scheduler wake-up, ~5-20 us, per job); the
 * bounded spin keeps an idle pool (or one on a loaded machine, where spinning steals the core
 * another thread needs) from burning CPU for more than a moment.
 *
 * The hand-over is lock-free in the common case: the caller publishes fn/arg, then increments
 * `gen` (seq_cst); a worker that sees the new gen runs the job and decrements `pending`. Sleeping
 * goes through the mutex with Dekker-style flags (`sleepers`, `main_waiting`) that the other side
 * checks after its own seq_cst write, so a wake-up is never lost. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "util.h"

#ifndef POOL_SPIN
#define POOL_SPIN 1024 /* pause-loops: ~50 ns each on the Zen 5 development machine, so ~50 us */
#endif

struct qf_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    qf_pool_fn fn; /* written by the caller before gen is incremented, read after */
    void *arg;
    _Atomic uint64_t gen;
    _Atomic int pending;      /* workers still running the current job */
    _Atomic int sleepers;     /* workers waiting (or about to wait) on cv_work */
    _Atomic bool main_waiting; /* the caller waits (or is about to) on cv_done */
    _Atomic bool stop;
};

typedef struct {
    qf_pool *p;
    int ith;
} worker_arg;

static void *worker_main(void *v) {
    worker_arg *wa = v;
    qf_pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) {
            if (spins++ < POOL_SPIN) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        p->fn(p->arg, ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->main_waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

qf_pool *qf_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    qf_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads, sizeof *p->threads);
        if (!p->threads) {
            free(p);
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) {
                p->n = i;
                break;
            }
            wa->p = p;
            wa->ith = i;
            if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n = i;
                break;
            }
        }
    }
    return p;
}

void qf_pool_free(qf_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

int qf_pool_size(const qf_pool *p) { return p ? p->n : 1; }

void qf_pool_run(qf_pool *p, qf_pool_fn fn, void *arg) {
    QF_ASSERT(fn != NULL);
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    /* every worker finished the previous job (pending reached 0), so none reads fn/arg now */
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n);
    for (int spins = 0; atomic_load(&p->pending) > 0 && spins < POOL_SPIN; spins++) cpu_relax();
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->main_waiting, true);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store(&p->main_waiting, false);
        pthread_mutex_unlock(&p->mu);
    }
}
