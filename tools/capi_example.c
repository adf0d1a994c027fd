/* blue-capi-example: the C API (host/bluevm.h) from plain C. Serves every prompt given on the
 * command line at once, on as many instances, and prints each completion as it finishes.
 *
 *   blue-capi-example MODEL.gguf "Once upon a time" "The dog" ...
 *
 * Build: part of the BlueVM build (tools/CMakeLists.txt); link against blue_host.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/bluevm.h"

struct completion {
    uint64_t id;
    char* text;
    size_t len;
    int done;
};

static int fail(const char* what, bluevm_status s) {
    fprintf(stderr, "blue-capi-example: %s: %s (%s)\n", what, bluevm_last_error(), bluevm_status_name(s));
    return 1;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [PROMPT...]\n", argv[0]);
        return 2;
    }
    const int n = argc - 2;
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.ctx = 256;
    bluevm_model* model = NULL;
    bluevm_status s = bluevm_model_open(argv[1], &mo, &model);
    if (s != BLUEVM_OK) return fail("opening the model", s);
    bluevm_model_info info;
    bluevm_model_get_info(model, &info);
    fprintf(stderr, "%s (%s, %u layers) on %s\n", info.name, info.architecture, info.n_layer, info.device);

    bluevm_engine_options eo;
    bluevm_engine_options_init(&eo);
    eo.instances = (uint32_t)n;
    bluevm_engine* engine = NULL;
    s = bluevm_engine_create(model, &eo, &engine);
    if (s != BLUEVM_OK) {
        bluevm_model_close(model);
        return fail("creating the engine", s);
    }
    struct completion* c = calloc((size_t)n, sizeof *c);
    for (int i = 0; i < n; ++i) {
        bluevm_request r;
        bluevm_request_init(&r);
        r.prompt = argv[i + 2];
        r.max_tokens = 48;
        r.temperature = 0; /* greedy: the same text every run */
        s = bluevm_submit(engine, &r, &c[i].id);
        if (s != BLUEVM_OK) return fail("submitting", s);
    }
    /* Round-robin over the requests, taking whatever text has arrived for each. */
    for (int remaining = n; remaining > 0;) {
        for (int i = 0; i < n; ++i) {
            if (c[i].done) continue;
            bluevm_event ev;
            s = bluevm_poll(engine, c[i].id, 10, &ev);
            if (s == BLUEVM_ERR_TIMEOUT) continue;
            if (s != BLUEVM_OK) return fail("polling", s);
            c[i].text = realloc(c[i].text, c[i].len + ev.text_len + 1);
            memcpy(c[i].text + c[i].len, ev.text, ev.text_len);
            c[i].len += ev.text_len;
            c[i].text[c[i].len] = '\0';
            if (ev.finished) {
                c[i].done = 1;
                --remaining;
                printf("[%d] %s%s\n", i, argv[i + 2], c[i].text);
                fflush(stdout);
                bluevm_release(engine, c[i].id);
            }
        }
    }
    bluevm_metrics m;
    bluevm_engine_metrics(engine, &m);
    fprintf(stderr, "%llu tokens, %llu GPU submits, %llu round trips\n",
            (unsigned long long)m.completion_tokens, (unsigned long long)m.submits,
            (unsigned long long)m.round_trips);
    for (int i = 0; i < n; ++i) free(c[i].text);
    free(c);
    bluevm_engine_destroy(engine);
    bluevm_model_close(model);
    return 0;
}
