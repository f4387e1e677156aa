/*
fuzz_shard.c: libFuzzer harness for the token-shard loader (dataloader.h; make fuzz). Each input is written as a
shard and opened as the trainer opens one (header, token width, exact size, vocabulary check), then read for a few
batches with shuffling on and with a vocabulary of 300; a refusal is an answer (the fuzz build turns fail_with_hint
into a return), a crash or a sanitizer report is a bug. The first byte picks a raw file or a valid header (magic,
version, the count that matches the size) in front of the fuzzer's tokens, so the token checks are reached too.
*/
#define TESTING
#define M2RNN_FUZZ
#include <unistd.h>

#include "dataloader.h"

static char fuzz_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(fuzz_path, sizeof(fuzz_path), "/tmp/fuzz_shard_%d.bin", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1 << 20)) { return 0; }
    FILE *fp = fopen(fuzz_path, "wb");
    if (fp == NULL) { abort(); }
    if (data[0] & 1) { // a valid header for the rest of the input as uint16 (even) or uint32 tokens
        int32_t header[256] = {0};
        const int wide = (data[0] & 2) != 0;
        header[0] = wide ? 20240801 : 20240520;
        header[1] = wide ? 7 : 1;
        header[2] = (int32_t)((size - 1) / (wide ? 4 : 2));
        fwrite(header, sizeof(int32_t), 256, fp);
        fwrite(data + 1, 1, (size_t)header[2] * (wide ? 4 : 2), fp);
    } else {
        fwrite(data + 1, 1, size - 1, fp);
    }
    fclose(fp);
    jmp_buf escape;
    fuzz_escape = &escape;
    DataLoader loader;
    memset(&loader, 0, sizeof(loader));
    if (setjmp(escape) == 0) {
        dataloader_init(&loader, fuzz_path, 2, 4, 0, 1, 1, 7, 300);
        for (int i = 0; i < 5; i++) { dataloader_next_batch(&loader); }
        DataLoaderState st;
        dataloader_get_state(&loader, &st);
        dataloader_set_state(&loader, &st);
        dataloader_next_batch(&loader);
    }
    fuzz_escape = NULL;
    dataloader_free(&loader); // after a refusal too: the open shard and the buffers (the programs exit instead)
    return 0;
}
