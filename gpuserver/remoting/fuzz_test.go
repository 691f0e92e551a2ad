package remoting

import (
	"context"
	"testing"
)

// FuzzDecodeRecord feeds arbitrary records to the decoder and dispatch: it must never panic, and a record it
// accepts must have the size its header announces. The seed corpus is the C shim's golden records plus
// testdata/fuzz/FuzzDecodeRecord.
func FuzzDecodeRecord(f *testing.F) {
	_, recs := goldenRecords(f)
	for _, r := range recs {
		f.Add(r)
	}
	resp := make([]byte, 1<<16)
	f.Fuzz(func(t *testing.T, rec []byte) {
		h := &recorder{}
		_, _, n, err := DecodeRecord(context.Background(), h, rec, resp)
		if err == nil && (len(rec) < wireRecordHeaderSize || n > len(resp)) {
			t.Fatalf("accepted a %d-byte record, wrote %d response bytes", len(rec), n)
		}
	})
}
