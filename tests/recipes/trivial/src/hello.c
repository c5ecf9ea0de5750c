#include <stdio.h>
int main(void) { puts("hello from a trivial build"); return 0; }
