/* generate MODEL PROMPT N: streams the greedy continuation of PROMPT (N tokens) to standard
 * output, as `pi2 run -m MODEL -p PROMPT -n N --temp 0` generates it (the continuation only).
 * MODEL is a GGUF path or a catalogue name. Set PI2_MEM_BUDGET (e.g. 50%) to run under a
 * memory budget, PI2_IGNORE_EOS=1 to generate past end-of-generation tokens (as --ignore-eos).
 * Statistics go to standard error.
 *
 * Build (from the repository, after `cargo build --release -p pi2-capi`):
 *   cc examples/c/generate.c -Icrates/pi2-capi/include target/release/libpi2_capi.a \
 *      -lm -lpthread -ldl -o generate
 */
#include <stdio.h>
#include <stdlib.h>

#include "pi2.h"

static bool print_piece(const char *text, size_t length, void *user_data) {
    (void)user_data;
    fwrite(text, 1, length, stdout);
    fflush(stdout);
    return true; /* false would stop the generation */
}

static int fail(const char *what, pi2_status status) {
    fprintf(stderr, "generate: %s: %s (status %d)\n", what, pi2_last_error(), (int)status);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL PROMPT N\n", argv[0]);
        return 2;
    }
    char *end = NULL;
    long n = strtol(argv[3], &end, 10);
    if (*argv[3] == '\0' || *end != '\0' || n < -1 || n > 1000000) {
        fprintf(stderr, "generate: N must be a number of tokens (or -1), not `%s`\n", argv[3]);
        return 2;
    }

    pi2_model_options mo = pi2_model_options_default();
    mo.mem_budget = getenv("PI2_MEM_BUDGET");
    const char *n_batch = getenv("PI2_N_BATCH");
    if (n_batch != NULL) mo.n_batch = (uint32_t)strtoul(n_batch, NULL, 10);
    mo.verbose = true;
    pi2_model *model = NULL;
    pi2_status st = pi2_model_open(argv[1], &mo, &model);
    if (st != PI2_OK) return fail("cannot open the model", st);

    pi2_session *session = NULL;
    st = pi2_session_new(model, &session);
    if (st != PI2_OK) return fail("cannot start a session", st);

    pi2_generate_options go = pi2_generate_options_default();
    go.max_tokens = (int32_t)n;
    go.temperature = 0.0f;
    const char *ignore_eos = getenv("PI2_IGNORE_EOS");
    go.ignore_eos = ignore_eos != NULL && ignore_eos[0] == '1';
    st = pi2_generate(session, argv[2], &go, print_piece, NULL);
    printf("\n");
    if (st != PI2_OK) return fail("generation failed", st);

    pi2_stats stats;
    if (pi2_session_stats(session, &stats) == PI2_OK) {
        fprintf(stderr, "generate: %llu tokens, %.2f tokens per second, %.0f bytes read per token, peak RSS %.1f MiB\n",
                (unsigned long long)stats.generated_tokens, stats.tokens_per_second,
                stats.bytes_read_per_token, stats.peak_rss_bytes / 1048576.0);
    }
    pi2_session_free(session);
    pi2_model_free(model);
    return 0;
}
