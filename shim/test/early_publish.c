/*
 * early_publish.c: makes N fire-and-forget launches, says "issued" and waits for a line on stdin before its
 * synchronize: the server must have received the launches meanwhile (gpuserver/remoting,
 * TestAsyncRecordsReachTheServerBeforeTheSynchronize). Usage: early_publish N. Prints "issued", then "synced R".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int cuInit(unsigned);
int cuCtxSynchronize(void);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
		   void **);

int main(int argc, char **argv) {
	long n = argc > 1 ? atol(argv[1]) : 10;
	if (cuInit(0) != 0) return 1;
	uint64_t args[4] = {0x7f0000001000ull, 0x7f0000002000ull, 0x7f0000003000ull, 1000};
	size_t size = sizeof args;
	void *extra[] = {(void *)1, args, (void *)2, &size, (void *)0};
	for (long i = 0; i < n; i++)
		if (cuLaunchKernel((void *)0x22, 4, 1, 1, 256, 1, 1, 0, NULL, NULL, extra) != 0) return 2;
	printf("issued\n");
	fflush(stdout);
	char line[16];
	if (fgets(line, sizeof line, stdin) == NULL) return 3;
	printf("synced %d\n", cuCtxSynchronize());
	return 0;
}
