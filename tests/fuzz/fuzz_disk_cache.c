/*
 * fuzz_disk_cache.c - libFuzzer target: the prefix cache's block-file
 * check (kv_disk_check_block, kv/disk_cache.h) on arbitrary bytes. The
 * files live in a directory other programs can write, and a kill -9 or a
 * full disk leaves them truncated: nothing in them may be trusted.
 *
 * The input's first byte picks a mode: odd, the bytes after it get a
 * correct checksum written into their last 8 bytes first, so that the
 * fuzzer reaches the checks the checksum would otherwise hide (it cannot
 * find an XXH3 collision by mutation); even, they are checked as read.
 * The layout is fixed and small: 4 positions, 2 layers (the second one
 * windowed), 8-byte rows. With bit 1 of the first byte set, the bytes are
 * a hybrid model's state file instead (kv_disk_check_state, 64 bytes of
 * state). With bit 2 set, an image-embedding file of the encoder
 * cache's disk tier (kt_embd_disk_check, 8 floats).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kv/disk_cache.h"
#include "vision/embd_disk.h"

#define BLOCK_TOKENS 4
#define N_LAYER 2
#define ROW_BYTES 8
#define LAYER_BYTES (2 * BLOCK_TOKENS * ROW_BYTES)
#define FILE_BYTES (72 + 4 * BLOCK_TOKENS + N_LAYER * LAYER_BYTES + 8)

static const int32_t IDS[BLOCK_TOKENS] = {1, 2, 3, 4};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const bool fix_checksum = data[0] & 1;
    size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1); /* its own allocation: ASan sees a read past n */
    if (!buf) return 0;
    memcpy(buf, data + 1, n);
    if (fix_checksum && n >= 8) {
        uint64_t h = XXH3_64bits(buf, n - 8);
        memcpy(buf + n - 8, &h, 8);
    }
    const kv_disk_expect x = {.fingerprint = 0x6b65746c65667a7aull, .block_tokens = BLOCK_TOKENS,
                              .n_layer = N_LAYER, .row_bytes = ROW_BYTES, .kv_type = 1, .n_win_layers = 1,
                              .file_bytes = FILE_BYTES, .file_bytes_nowin = FILE_BYTES - LAYER_BYTES,
                              .key = kv_disk_chain(kv_disk_root(), IDS, BLOCK_TOKENS), .parent = kv_disk_root(),
                              .ids = IDS};
    bool windows;
    volatile bool ok = data[0] & 4   ? kt_embd_disk_check(buf, n, x.fingerprint, 0x696d616765ull, 8)
                       : data[0] & 2 ? kv_disk_check_state(buf, n, x.fingerprint, kv_disk_state_key(x.key), 64)
                                     : kv_disk_check_block(buf, n, &x, &windows);
    (void)ok;
    free(buf);
    return 0;
}
