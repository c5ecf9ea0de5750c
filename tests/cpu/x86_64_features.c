/* Prints the CPU features this process sees, by /proc/cpuinfo's (archspec's) names: run under
 * `qemu-x86_64-static -cpu max`, it lists what QEMU emulates (qemu-user passes the host's
 * /proc/cpuinfo through, so only CPUID tells). Used by tests/test_cpu.py. */
#include <stdio.h>

#define HAS(gcc_name, name) if (__builtin_cpu_supports(gcc_name)) printf("%s\n", name);

int main(void) {
    __builtin_cpu_init();
    HAS("sse3", "sse3") HAS("ssse3", "ssse3") HAS("sse4.1", "sse4_1") HAS("sse4.2", "sse4_2")
    HAS("sse4a", "sse4a") HAS("popcnt", "popcnt") HAS("lzcnt", "abm") HAS("cmpxchg16b", "cx16")
    HAS("lahf_lm", "lahf_lm") HAS("movbe", "movbe") HAS("avx", "avx") HAS("avx2", "avx2")
    HAS("fma", "fma") HAS("fma4", "fma4") HAS("xop", "xop") HAS("f16c", "f16c")
    HAS("bmi", "bmi1") HAS("bmi2", "bmi2") HAS("tbm", "tbm") HAS("adx", "adx") HAS("aes", "aes")
    HAS("pclmul", "pclmulqdq") HAS("sha", "sha_ni") HAS("rdrnd", "rdrand") HAS("rdseed", "rdseed")
    HAS("rdpid", "rdpid") HAS("fsgsbase", "fsgsbase") HAS("xsave", "xsave") HAS("xsavec", "xsavec")
    HAS("xsaveopt", "xsaveopt") HAS("clflushopt", "clflushopt") HAS("clwb", "clwb")
    HAS("clzero", "clzero") HAS("prfchw", "3dnowprefetch") HAS("rtm", "rtm") HAS("pku", "pku")
    HAS("gfni", "gfni") HAS("vaes", "vaes") HAS("vpclmulqdq", "vpclmulqdq")
    HAS("avxvnni", "avx_vnni") HAS("avx512f", "avx512f") HAS("avx512vl", "avx512vl")
    HAS("avx512bw", "avx512bw") HAS("avx512dq", "avx512dq") HAS("avx512cd", "avx512cd")
    HAS("avx512ifma", "avx512ifma") HAS("avx512vbmi", "avx512vbmi")
    HAS("avx512vbmi2", "avx512_vbmi2") HAS("avx512vnni", "avx512_vnni")
    HAS("avx512bitalg", "avx512_bitalg") HAS("avx512vpopcntdq", "avx512_vpopcntdq")
    HAS("avx512bf16", "avx512_bf16") HAS("avx512fp16", "avx512_fp16")
    HAS("avx512vp2intersect", "avx512_vp2intersect") HAS("movdiri", "movdiri")
    HAS("movdir64b", "movdir64b") HAS("serialize", "serialize") HAS("waitpkg", "waitpkg")
    HAS("cldemote", "cldemote") HAS("amx-tile", "amx_tile") HAS("amx-int8", "amx_int8")
    HAS("amx-bf16", "amx_bf16") HAS("mwaitx", "mwaitx")
    return 0;
}
