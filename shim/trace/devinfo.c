/*
 * devinfo.c: prints what the real driver reports for device 0, one tab-separated line each, for the fixtures the
 * shim's simulated presets and tests are checked against:
 *   driver <version>            name <name>            uuid <16 bytes hex>      pci <bus id>
 *   total_mem <bytes>           cc <major>.<minor>     attr <n> <value>  (or  attr <n> error <CUresult>)
 * usage: devinfo [path/to/libcuda.so.1]
 */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*fn_i)(int *, ...);

int main(int argc, char **argv) {
	const char *path = argc > 1 ? argv[1] : "libcuda.so.1";
	void *lib = dlopen(path, RTLD_NOW);
	if (lib == NULL) {
		fprintf(stderr, "devinfo: %s\n", dlerror());
		return 1;
	}
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
	int (*version)(int *) = (int (*)(int *))dlsym(lib, "cuDriverGetVersion");
	int (*get)(int *, int) = (int (*)(int *, int))dlsym(lib, "cuDeviceGet");
	int (*name)(char *, int, int) = (int (*)(char *, int, int))dlsym(lib, "cuDeviceGetName");
	int (*uuid)(unsigned char *, int) = (int (*)(unsigned char *, int))dlsym(lib, "cuDeviceGetUuid_v2");
	int (*pci)(char *, int, int) = (int (*)(char *, int, int))dlsym(lib, "cuDeviceGetPCIBusId");
	int (*mem)(size_t *, int) = (int (*)(size_t *, int))dlsym(lib, "cuDeviceTotalMem_v2");
	int (*attr)(int *, int, int) = (int (*)(int *, int, int))dlsym(lib, "cuDeviceGetAttribute");
	if (!init || !version || !get || !name || !uuid || !pci || !mem || !attr) {
		fprintf(stderr, "devinfo: entry points missing\n");
		return 1;
	}
	int r = init(0);
	if (r != 0) {
		fprintf(stderr, "devinfo: cuInit: %d\n", r);
		return 1;
	}
	int v = 0, dev = 0;
	version(&v);
	get(&dev, 0);
	char buf[256] = "";
	unsigned char u[16] = {0};
	size_t total = 0;
	printf("driver\t%d\n", v);
	if (name(buf, sizeof buf, dev) == 0) printf("name\t%s\n", buf);
	if (uuid(u, dev) == 0) {
		printf("uuid\t");
		for (int i = 0; i < 16; i++) printf("%02x", u[i]);
		printf("\n");
	}
	if (pci(buf, sizeof buf, dev) == 0) printf("pci\t%s\n", buf);
	if (mem(&total, dev) == 0) printf("total_mem\t%zu\n", total);
	for (int a = 1; a < 512; a++) {
		int value = 0;
		r = attr(&value, a, dev);
		if (r == 0)
			printf("attr\t%d\t%d\n", a, value);
		else
			printf("attr\t%d\terror\t%d\n", a, r);
	}
	return 0;
}
