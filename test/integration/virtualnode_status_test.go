package integration

import (
	"testing"

	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// Contract stubs, replaced by the status and admission work (issue 23 items 3, 4).

func testVirtualNodeStatus(t *testing.T, bed *testbed.Bed)      { t.Fatal("not built yet") }
func testVirtualNodeUnreserved(t *testing.T, bed *testbed.Bed)  { t.Fatal("not built yet") }
func testVirtualNodeDaemonSet(t *testing.T, bed *testbed.Bed)   { t.Fatal("not built yet") }
func testVirtualNodeTenantQuota(t *testing.T, bed *testbed.Bed) { t.Fatal("not built yet") }
