package remoting

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// goldenRecords reads shim/testdata/records.golden: the records the C shim wrote in its test.
func goldenRecords(t testing.TB) (names []string, recs [][]byte) {
	t.Helper()
	f, err := os.Open("../../shim/testdata/records.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, h, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("bad golden line %q", line)
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		names, recs = append(names, name), append(recs, b)
	}
	return names, recs
}

// recorder captures the decoded arguments of the golden calls.
type recorder struct {
	UnimplementedHandler
	got []any
}

func (r *recorder) CuMemAlloc_v2(_ context.Context, size uint64) (uint64, Result) {
	r.got = append(r.got, size)
	return 0x7f0000001000, ResultSuccess
}

func (r *recorder) CuMemcpyHtoD_v2(_ context.Context, dst uint64, src []byte, n uint64) Result {
	r.got = append(r.got, dst, string(src), n)
	return ResultSuccess
}

func (r *recorder) CuMemsetD32_v2(_ context.Context, dst uint64, v uint32, n uint64) Result {
	r.got = append(r.got, dst, v, n)
	return ResultSuccess
}

func (r *recorder) CuModuleLoadData(_ context.Context, image []byte, size uint64) (uint64, Result) {
	r.got = append(r.got, string(image[:len(image)-1]), size)
	return 0x11, ResultSuccess
}

func (r *recorder) CuModuleGetFunction(_ context.Context, params []byte, hmod uint64, name string) (uint64, Result) {
	r.got = append(r.got, len(params), hmod, name)
	return 0x22, ResultSuccess
}

func (r *recorder) CuLaunchKernel(_ context.Context, f uint64, gx, gy, gz, bx, by, bz, shmem uint32, stream uint64,
	args []byte, n uint64) Result {
	r.got = append(r.got, f, gx, gy, gz, bx, by, bz, shmem, stream, hex.EncodeToString(args), n)
	return ResultSuccess
}

func (r *recorder) CuCtxSynchronize(context.Context) Result {
	r.got = append(r.got, "sync")
	return ResultSuccess
}

func (r *recorder) CuMemcpyDtoH_v2(_ context.Context, dst []byte, src, n uint64) Result {
	r.got = append(r.got, len(dst), src, n)
	copy(dst, "0123456789abcdef")
	return ResultSuccess
}

// TestGoldenRecordsDecode pins the record layout: the bytes the C shim wrote decode to the calls it made.
func TestGoldenRecordsDecode(t *testing.T) {
	names, recs := goldenRecords(t)
	r := &recorder{}
	resp := make([]byte, 1<<16)
	for i, rec := range recs {
		id, res, _, err := DecodeRecord(context.Background(), r, rec, resp)
		if err != nil {
			t.Fatalf("record %d (%s): %v", i, names[i], err)
		}
		if id.String() != names[i] || res != ResultSuccess {
			t.Fatalf("record %d: decoded %s result %d, golden file says %s", i, id, res, names[i])
		}
	}
	ptx := "//\n.version 8.0\n.target sm_90\n.address_size 64\n"
	want := []any{
		uint64(4096),
		uint64(0x7f0000001000), "hello", uint64(5),
		uint64(0x7f0000001000), uint32(0xdeadbeef), uint64(4),
		ptx, uint64(len(ptx) + 1),
		1028, uint64(0x11), "vector_add",
		uint64(0x22), uint32(4), uint32(1), uint32(1), uint32(256), uint32(1), uint32(1), uint32(0), uint64(0),
		"00100000007f000000200000007f0000e8030000", uint64(20),
		"sync",
		16, uint64(0x7f0000001000), uint64(16),
	}
	if len(r.got) != len(want) {
		t.Fatalf("decoded %d values, want %d: %v", len(r.got), len(want), r.got)
	}
	for i := range want {
		if r.got[i] != want[i] {
			t.Errorf("value %d: got %#v, want %#v", i, r.got[i], want[i])
		}
	}
}

// TestRecordLayoutConstants pins the header and control block offsets shared with the C shim.
func TestRecordLayoutConstants(t *testing.T) {
	for name, got := range map[string][2]int{
		"record header": {wireRecordHeaderSize, 16},
		"response hdr":  {wireResponseHeaderSize, 16},
		"control":       {wireControlSize, 4096},
		"req tail":      {wireCtlReqTail, 64},
		"req head":      {wireCtlReqHead, 128},
		"server wait":   {wireCtlServerWaiting, 192},
		"resp seq":      {wireCtlRespSeq, 256},
		"client wait":   {wireCtlClientWaiting, 320},
		"hello":         {wireHelloSize, 288},
		"hello token":   {wireHelloToken, 152},
		"reply":         {wireReplySize, 1592},
		"reply attrs":   {wireReplyAttrs, 312},
		"reply message": {wireReplyMessage, 1336},
	} {
		if got[0] != got[1] {
			t.Errorf("%s: %d, pinned %d (a change is a major version bump)", name, got[0], got[1])
		}
	}
	if wireReplyAttrs+4*wireAttrCount != wireReplyMessage || wireReplyMessage+256 != wireReplySize {
		t.Error("reply fields overlap")
	}
	if wireHelloToken+wireNameMax > wireHelloSize {
		t.Error("hello fields overlap")
	}
}

func TestDecodeRejectsMalformedRecords(t *testing.T) {
	_, recs := goldenRecords(t)
	resp := make([]byte, 4096)
	h := &recorder{}
	for i, rec := range recs {
		for _, cut := range []int{0, 8, len(rec) - 8} {
			if cut >= len(rec) || cut < 0 {
				continue
			}
			if _, _, _, err := DecodeRecord(context.Background(), h, rec[:cut], resp); err == nil {
				t.Errorf("record %d cut to %d bytes decoded", i, cut)
			}
		}
	}
}
