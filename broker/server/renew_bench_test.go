package server_test

// BenchmarkRenewLeases measures what renewing the leases of 10,000 bound
// pods costs: 10,000 live leases of one requester in a real redis-server,
// renewed through rb-broker in its own process (HTTPS, mutual TLS, the
// typed client) as the requester agent does it, one round = 2 calls of
// api.MaxRenewBatch (5000) ids; and, in the same run, the baseline of one id
// per call (10,000 calls per round, 8 in flight). Each line reports ns per
// id, calls/s, and the CPU of redis-server (INFO cpu) and of the broker
// process (/proc) per round. It runs only with -bench; see
// docs/benchmarks.md, "Lease renewal".

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

const renewPods = 10_000

func BenchmarkRenewLeases(b *testing.B) {
	ctx := context.Background()
	bk := brokertest.Start(b, brokertest.Options{Store: store.Config{StaleThreshold: time.Hour}})
	const gi = int64(1) << 30
	for i := range 4 {
		r := model.Resources{CPU: 100_000_000, Memory: 400_000 * gi, Storage: 1_000_000 * gi}
		_, err := bk.Store.Advertise(ctx, fmt.Sprintf("p%d", i), model.Advertisement{Capacity: r, Allocatable: r,
			Prices: model.Prices{CPU: 30_000 + int64(i)*1000, Memory: 4_000, Currency: "EUR"}})
		require.NoError(b, err)
	}
	// 10,000 leases of rome, as its agent makes them (one per pod, 2m lease;
	// an hour of hold time so that none lapses during the run).
	ids := make([]string, renewPods)
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= renewPods {
					return
				}
				ids[i] = fmt.Sprintf("pod-%05d-0f3c9a2e-6b1d-4c8e-9a7f", i)
				_, err := bk.Store.Reserve(ctx, model.ReserveRequest{ID: ids[i], Requester: "rome", Owner: "default/pod",
					Resources: model.Resources{CPU: 250, Memory: 256 << 20}, Duration: time.Hour, Lease: 2 * time.Minute})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(b, <-errs)

	bin := os.Getenv("RB_BENCH_BROKER_BIN")
	if bin == "" {
		bin = brokertest.BuildBroker(b, b.TempDir())
	}
	// What renewing costs, not the members' renewal rates (which would
	// hold rome to 2,000 ids a second): those off.
	policyFile := filepath.Join(b.TempDir(), "policy.yaml")
	require.NoError(b, os.WriteFile(policyFile, []byte(`apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
members:
  default:
    renewals: {perSecond: "0"}
    renewedIDs: {perSecond: "0"}
    renewalBytes: {perSecond: "0"}
`), 0o600))
	proc := bk.StartProcess(bin, strings.Fields(os.Getenv("RB_BENCH_BROKER_ENV")), "--stale-threshold=1h", "--policy-file="+policyFile)
	rome, err := client.New(proc.URL, bk.ClusterCertDir("rome"), client.WithRetries(0, 0))
	require.NoError(b, err)
	b.Cleanup(rome.CloseIdleConnections)
	resp, err := rome.Renew(ctx, ids[:api.MaxRenewBatch])
	require.NoError(b, err)
	require.Len(b, resp.Renewed, api.MaxRenewBatch, "every lease renewed: %+v", resp.Refused)

	// line runs round b.N times and reports its costs; calls is the number of calls per round.
	line := func(b *testing.B, calls int, round func() error) {
		start := readCPU(b, bk.RDB)
		procStart, err := proc.CPU()
		require.NoError(b, err)
		b.ResetTimer()
		began := time.Now()
		for range b.N {
			if err := round(); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(began)
		b.StopTimer()
		end := readCPU(b, bk.RDB)
		procEnd, err := proc.CPU()
		require.NoError(b, err)
		n := float64(b.N)
		b.ReportMetric(float64(elapsed.Nanoseconds())/n/renewPods, "ns/id")
		b.ReportMetric(float64(calls)*n/elapsed.Seconds(), "calls/s")
		b.ReportMetric((end.redis-start.redis)*1e3/n, "redis-cpu-ms/round")
		b.ReportMetric(float64((procEnd-procStart).Microseconds())/1e3/n, "broker-cpu-ms/round")
		b.ReportMetric((end.self-start.self)*1e3/n, "client-cpu-ms/round")
	}
	renew := func(batch []string) error {
		resp, err := rome.Renew(ctx, batch)
		if err == nil && len(resp.Renewed) != len(batch) {
			err = fmt.Errorf("%d of %d renewed: %+v", len(resp.Renewed), len(batch), resp.Refused[:min(3, len(resp.Refused))])
		}
		return err
	}
	var batchNs float64
	b.Run("batch-5000", func(b *testing.B) {
		start := time.Now()
		line(b, renewPods/api.MaxRenewBatch, func() error {
			for i := 0; i < renewPods; i += api.MaxRenewBatch {
				if err := renew(ids[i : i+api.MaxRenewBatch]); err != nil {
					return err
				}
			}
			return nil
		})
		batchNs = float64(time.Since(start).Nanoseconds()) / float64(b.N)
	})
	b.Run("baseline-1-per-call", func(b *testing.B) {
		start := time.Now()
		line(b, renewPods, func() error {
			var next atomic.Int64
			var wg sync.WaitGroup
			var first atomic.Pointer[error]
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= renewPods {
							return
						}
						if err := renew(ids[i : i+1]); err != nil {
							first.CompareAndSwap(nil, &err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if p := first.Load(); p != nil {
				return *p
			}
			return nil
		})
		if batchNs > 0 {
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/batchNs, "x-batch-time")
		}
	})
}
