/* pool.c: a fixed pthread pool running one parallel-for at a time.
 *
 * Workers sleep on a condition variable between jobs; a job is (fn, arg) plus a generation
 * counter. The forward pass issues a few hundred jobs per chunk, so the wake-up cost (a few
 * microseconds) is small next to the work; spinning would steal the second core from OpenBLAS. */
#include <pthread.h>
#include <stdlib.h>

#include "util.h"

struct qf_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    qf_pool_fn fn;
    void *arg;
    uint64_t gen;
    int pending;
    bool stop;
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
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        qf_pool_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->stop = true;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
