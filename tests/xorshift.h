/* The fuzz drivers' random numbers (tests/fuse/dirents_fuzz.c, tests/hostile/cscan_fuzz.c): xorshift64 from a
 * fixed state, so that a run is the same run every time. */
#ifndef CKPTFS_TESTS_XORSHIFT_H
#define CKPTFS_TESTS_XORSHIFT_H

#include <stdint.h>

static uint64_t xorshift_state = 0x9e3779b97f4a7c15u;

static uint64_t next_random(void) {
    xorshift_state ^= xorshift_state << 13;
    xorshift_state ^= xorshift_state >> 7;
    xorshift_state ^= xorshift_state << 17;
    return xorshift_state;
}

#endif
