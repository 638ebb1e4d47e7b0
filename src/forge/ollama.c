/* ollama.c: the Ollama HTTP client the corpus stage uses to synthesize text (libcurl +
 * jansson). One blocking, non-streaming POST to /api/generate per document. Forge-side only:
 * the engine never talks to Ollama. */
#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/corpus.h"

#define MAX_REPLY (64u << 20) /* a generated document is kilobytes; anything huge is wrong */

typedef struct {
    char *p;
    size_t n, cap;
    bool too_big, oom;
} reply_buf;

static size_t on_data(char *data, size_t size, size_t nmemb, void *ud) {
    reply_buf *b = ud;
    size_t n = size * nmemb;
    if (n > MAX_REPLY - b->n) {
        b->too_big = true;
        return 0; /* makes curl stop with CURLE_WRITE_ERROR */
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return 0;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = '\0';
    return n;
}

/* Ollama reports failures as {"error": "..."}; fall back to the start of the body. */
static void reply_reason(const reply_buf *b, json_t *root, char *out, size_t cap) {
    json_t *e = json_is_object(root) ? json_object_get(root, "error") : NULL;
    if (json_is_string(e)) snprintf(out, cap, "%s", json_string_value(e));
    else if (b->n) snprintf(out, cap, "%.200s", b->p);
    else snprintf(out, cap, "(empty body)");
}

qf_status qf_ollama_generate(const qf_ollama_opts *o, const char *prompt, long seed, char **out,
                             size_t *out_len, qf_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!o || !o->url || (strncmp(o->url, "http://", 7) != 0 && strncmp(o->url, "https://", 8) != 0))
        return qf_fail(err, QF_ERR_ARG, "ollama: url '%s': expected http://HOST:PORT",
                       o && o->url ? o->url : "(null)");
    if (!o->model || !*o->model) return qf_fail(err, QF_ERR_ARG, "ollama: model: expected a model name");
    if (!prompt) return qf_fail(err, QF_ERR_ARG, "ollama: NULL prompt");

    char endpoint[2048];
    size_t ul = strlen(o->url);
    while (ul > 0 && o->url[ul - 1] == '/') ul--;
    if (ul > sizeof endpoint - 32) return qf_fail(err, QF_ERR_ARG, "ollama: url: too long");
    snprintf(endpoint, sizeof endpoint, "%.*s/api/generate", (int)ul, o->url);

    json_t *req = json_pack("{s:s, s:s, s:b, s:{s:I}}", "model", o->model, "prompt", prompt,
                            "stream", 0, "options", "seed", (json_int_t)seed);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body) return qf_fail(err, QF_ERR_FORMAT, "ollama: cannot encode the request (is the prompt valid UTF-8?)");

    CURL *h = curl_easy_init();
    if (!h) {
        free(body);
        return qf_fail(err, QF_ERR_NOMEM, "ollama: cannot start libcurl");
    }
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    reply_buf b = {0};
    char curl_msg[CURL_ERROR_SIZE] = "";
    long connect_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 2000;
    long total_s = o->timeout_s > 0 ? o->timeout_s : 600;
    curl_easy_setopt(h, CURLOPT_URL, endpoint);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_PROXY, ""); /* Ollama is local; an http_proxy must not reroute it */
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(h, CURLOPT_USERAGENT, "qforge/" QF_VERSION);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, total_s);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_msg);
    CURLcode rc = curl_easy_perform(h);
    long http = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
    curl_off_t tconnect = 0; /* stays 0 when no connection was made */
    curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &tconnect);
    bool connected = tconnect > 0;
    curl_easy_cleanup(h);
    curl_slist_free_all(hdr);
    free(body);

    qf_status st = QF_OK;
    const char *why = curl_msg[0] ? curl_msg : curl_easy_strerror(rc);
    if (rc != CURLE_OK) {
        if (b.too_big)
            st = qf_fail(err, QF_ERR_FORMAT, "ollama at %s: reply larger than %u MiB", o->url, MAX_REPLY >> 20);
        else if (b.oom)
            st = qf_fail(err, QF_ERR_NOMEM, "ollama at %s: out of memory reading the reply", o->url);
        else if (rc == CURLE_OPERATION_TIMEDOUT && connected)
            st = qf_fail(err, QF_ERR_OLLAMA_UNAVAILABLE, "ollama at %s: no complete answer within %ld s (%s)",
                         o->url, total_s, why);
        else if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                 rc == CURLE_OPERATION_TIMEDOUT)
            st = qf_fail(err, QF_ERR_OLLAMA_UNAVAILABLE,
                         "ollama at %s is unreachable: %s (is `ollama serve` running there?)", o->url, why);
        else
            st = qf_fail(err, QF_ERR_OLLAMA_UNAVAILABLE, "ollama at %s: request failed: %s", o->url, why);
        free(b.p);
        return st;
    }

    json_error_t jerr;
    json_t *root = b.n ? json_loadb(b.p, b.n, 0, &jerr) : NULL;
    char reason[400];
    if (http < 200 || http >= 300) {
        reply_reason(&b, root, reason, sizeof reason);
        st = qf_fail(err, QF_ERR_OLLAMA_UNAVAILABLE, "ollama at %s: HTTP %ld for model '%s': %s",
                     o->url, http, o->model, reason);
    } else if (!json_is_object(root)) {
        st = qf_fail(err, QF_ERR_FORMAT, "ollama at %s: reply is not a JSON object (%s); body starts: %.120s",
                     o->url, b.n ? jerr.text : "empty body", b.n ? b.p : "");
    } else {
        json_t *resp = json_object_get(root, "response");
        if (!json_is_string(resp)) {
            reply_reason(&b, root, reason, sizeof reason);
            st = qf_fail(err, QF_ERR_FORMAT,
                         "ollama at %s: reply: field \"response\": expected a string (%s)", o->url, reason);
        } else {
            size_t n = json_string_length(resp);
            char *t = malloc(n + 1);
            if (!t) {
                st = qf_fail(err, QF_ERR_NOMEM, "ollama: out of memory");
            } else {
                memcpy(t, json_string_value(resp), n);
                t[n] = '\0';
                *out = t;
                if (out_len) *out_len = n;
            }
        }
    }
    json_decref(root);
    free(b.p);
    return st;
}
