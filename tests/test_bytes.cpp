// test_bytes.cpp — the byte-size parser shared by the ZCCL_* settings and the tools (util/bytes.c). The expected
// values are written out by hand (powers of 1024), independent of the parser's code.
#include <gtest/gtest.h>

#include <cstdint>

extern "C" {
#include "bytes.h"
}

namespace {

uint64_t Parse(const char *s) {
    uint64_t v = 0xdeadbeef;
    EXPECT_EQ(zccl__parse_bytes(s, &v), 0) << "'" << s << "' should parse";
    return v;
}

void Rejects(const char *s) {
    uint64_t v = 12345;
    EXPECT_EQ(zccl__parse_bytes(s, &v), -1) << "'" << (s ? s : "(null)") << "' should be rejected";
    EXPECT_EQ(v, 12345u) << "the output is written only on success ('" << (s ? s : "(null)") << "')";
}

TEST(Bytes, UnitsAndSpellings) {
    EXPECT_EQ(Parse("0"), 0u);
    EXPECT_EQ(Parse("4096"), 4096u);
    EXPECT_EQ(Parse("4096B"), 4096u);
    for (const char *s : {"64K", "64k", "64KiB", "64KB", "64kb", "64kB"}) EXPECT_EQ(Parse(s), 65536u) << s;
    for (const char *s : {"25M", "25MiB", "25MB", "25m"}) EXPECT_EQ(Parse(s), 26214400u) << s;
    EXPECT_EQ(Parse("3G"), 3221225472u);
    EXPECT_EQ(Parse("2T"), 2199023255552u);
    EXPECT_EQ(Parse("1.5M"), 1572864u);
    EXPECT_EQ(Parse("0.25K"), 256u);
    EXPECT_EQ(Parse("4611686018427387903"), 4611686018427387903u); /* 2^62 - 1 */
}

TEST(Bytes, Malformed) {
    for (const char *s : {"", "x", "-1", "+1", " 1", "1 ", "1.5", "1.", ".5K", "1.1K", "25Mi", "25MiBx", "1KK",
                          "1e3", "4611686018427387904", "4194304T", "99999999999999999999999",
                          // 2^64 and 2^64 + 6: the digit loop must not wrap to 0 / 6 before its limit check
                          "18446744073709551616", "18446744073709551622", "18446744073709551615"})
        Rejects(s);
    Rejects(nullptr);
    uint64_t v = 0;
    ASSERT_EQ(zccl__parse_bytes("4611686018427387903", &v), 0);  // 2^62 - 1: the largest accepted
    EXPECT_EQ(v, (UINT64_C(1) << 62) - 1);
}

}  // namespace
