package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// FuzzDecodeRenewRequest: DecodeRenewRequest answers every body as Decode
// does, the same ids or the same error.
func FuzzDecodeRenewRequest(f *testing.F) {
	for _, s := range []string{
		`{"ids":["a","b-1","pod.x"]}`,
		` { "ids" : [ "a" , "b" ] } `,
		"{\"ids\":\t[\n]\r}",
		`{"ids":[]}`,
		`{"ids":[""]}`,
		`{"ids":["a"]}x`,
		`{"ids":["a"],"ids":["b"]}`,
		`{"IDS":["a"]}`,
		`{"ids":["\u0061"]}`,
		`{"ids":["a",]}`,
		`{"ids":null}`,
		`{"ids":["a"]`,
		`{}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want api.RenewRequest
		wantErr := api.Decode(bytes.NewReader(data), &want)
		got, err := api.DecodeRenewRequest(bytes.NewReader(data), int64(len(data)))
		if fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Fatalf("%q: error %v, Decode's %v", data, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %#v, Decode's %#v", data, got, want)
		}
		unsized, err := api.DecodeRenewRequest(bytes.NewReader(data), -1) // a chunked body
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || err == nil && !reflect.DeepEqual(unsized, want) {
			t.Fatalf("%q, length unknown: %#v, %v; Decode's %#v, %v", data, unsized, err, want, wantErr)
		}
	})
}

// BenchmarkDecodeRenewRequest: the largest renewal an agent sends (5,000
// ids of 200 characters, about 1 MB), read by DecodeRenewRequest and by
// Decode, in the same run.
func BenchmarkDecodeRenewRequest(b *testing.B) {
	var body api.RenewRequest
	for i := range api.MaxRenewBatch {
		body.IDs = append(body.IDs, fmt.Sprintf("%0*d", 200, i))
	}
	data, err := json.Marshal(body)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		decode func(*bytes.Reader) (api.RenewRequest, error)
	}{
		{"scanner", func(r *bytes.Reader) (api.RenewRequest, error) { return api.DecodeRenewRequest(r, r.Size()) }},
		{"reflecting", func(r *bytes.Reader) (out api.RenewRequest, err error) { return out, api.Decode(r, &out) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				got, err := c.decode(bytes.NewReader(data))
				if err != nil || len(got.IDs) != api.MaxRenewBatch {
					b.Fatalf("%d ids, %v", len(got.IDs), err)
				}
			}
		})
	}
}
