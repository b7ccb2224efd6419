package server_test

// BenchmarkListReservations measures lists against a member with 60,000
// live reservations (one unpaginated answer was 28 MB, and 8 such
// calls in parallel took the broker to 3.2 GB): the broker runs as its own
// process (rb-broker, as deployed, on the same redis-server and
// certificates), 8 clients list every reservation at once through
// broker/client, which follows the pages. One op is one full listing by each
// of the 8. Reported: the time of a full listing, the pages it took, the
// broker's peak RSS (VmHWM) and its RSS before. It runs only with -bench;
// see docs/benchmarks.md.

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

const (
	listLive    = 60_000
	listClients = 8
)

func BenchmarkListReservations(b *testing.B) {
	bk := brokertest.Start(b, brokertest.Options{})
	bk.Advertise("paris", "64", "256Gi", "", "0.03", nil)
	code, data := bk.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("bulk", "1", "1Gi"))
	require.Equal(b, http.StatusCreated, code, "%s", data)
	cloneReservations(b, bk, "rome", "paris", "bulk", listLive-1)
	proc := bk.StartProcess(brokertest.BuildBroker(b, b.TempDir()), nil)
	rssBefore := procStatusKiB(b, proc.Pid, "VmRSS")

	clients := make([]*client.Client, listClients)
	for i := range clients {
		c, err := client.New(proc.URL, bk.ClusterCertDir("rome"))
		require.NoError(b, err)
		b.Cleanup(c.CloseIdleConnections)
		clients[i] = c
	}
	// One page, to count the pages of a listing.
	code, data = bk.Do("rome", http.MethodGet, "/api/v2/reservations?role=requester", nil)
	require.Equal(b, http.StatusOK, code)
	pageBytes := len(data)
	pageItems := len(brokertest.Decode[api.ReservationList](b, data).Items)

	b.ResetTimer()
	start := time.Now()
	for range b.N {
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				all, err := c.Reservations(context.Background(), client.RoleRequester)
				if err != nil {
					b.Error(err)
					return
				}
				if len(all) != listLive {
					b.Errorf("client %d listed %d reservations, want %d", i, len(all), listLive)
				}
			}()
		}
		wg.Wait()
	}
	b.StopTimer()
	b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "s/8-listings")
	b.ReportMetric(float64(pageBytes)/1024, "page-KiB")
	b.ReportMetric(float64(listLive)/float64(pageItems), "pages/listing")
	b.ReportMetric(float64(rssBefore)/1024, "broker-rss-before-MiB")
	b.ReportMetric(float64(procStatusKiB(b, proc.Pid, "VmHWM"))/1024, "broker-peak-rss-MiB")
}

// procStatusKiB reads a field of /proc/<pid>/status in KiB (VmRSS, VmHWM).
func procStatusKiB(b *testing.B, pid int, field string) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(b, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
