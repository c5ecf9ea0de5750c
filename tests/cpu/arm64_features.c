/* Prints the CPU features this process sees, by /proc/cpuinfo's names (the kernel's hwcaps, as
 * getauxval gives them): run under `qemu-aarch64-static -cpu max`, it lists what QEMU emulates.
 * Used by tests/test_cpu.py. */
#include <stdio.h>
#include <sys/auxv.h>

static const char *const hwcap[] = {
    "fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp",
    "asimdhp", "cpuid", "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4",
    "asimddp", "sha512", "sve", "asimdfhm", "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb",
    "paca", "pacg"};
static const char *const hwcap2[] = {
    "dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint",
    "svei8mm", "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng", "bti", "mte",
    "ecv", "afp", "rpres", "mte3", "sme", "smei16i64", "smef64f64", "smei8i32", "smef16f32",
    "smeb16f32", "smef32f32", "smefa64", "wfxt"};

int main(void) {
    unsigned long one = getauxval(AT_HWCAP), two = getauxval(AT_HWCAP2);
    for (unsigned i = 0; i < sizeof hwcap / sizeof *hwcap; i++)
        if (one >> i & 1) printf("%s\n", hwcap[i]);
    for (unsigned i = 0; i < sizeof hwcap2 / sizeof *hwcap2; i++)
        if (two >> i & 1) printf("%s\n", hwcap2[i]);
    return 0;
}
