// Package bridge is the requester side's last step: it turns the reservations
// this cluster won into a node the scheduler can bind pods to, and makes the
// pods bound there run on the provider. One interface, two implementations,
// chosen by --bridge:
//
//   - virtual-kubelet (default, needs nothing but the two API servers): one
//     virtual node rb-<provider> per provider, served in-process with
//     github.com/virtual-kubelet/virtual-kubelet; its pods are mirrored into
//     the provider's tenant namespace with the credentials the provider granted
//     (see package virtualkubelet).
//   - liqo (clusters peered with Liqo): a Liqo ResourceSlice per reservation,
//     whose virtual node is labelled for the scheduler plugin (see package liqo).
//
// Either way the bridge writes status.virtualNode of the Reservations it serves.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fluidos-project/resource-broker/agent/bridge/liqo"
	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/broker/api"
)

// Modes of the bridge (the --bridge flag).
const (
	ModeVirtualKubelet = "virtual-kubelet"
	ModeLiqo           = "liqo"
)

// Modes lists the accepted modes, the default first.
var Modes = []string{ModeVirtualKubelet, ModeLiqo}

// Bridge is what the agent runs: it registers its controllers and runnables
// with the manager (all of them leader-elected).
type Bridge interface {
	SetupWithManager(mgr ctrl.Manager) error
}

// GrantSource reads a reservation with the provider's grant (endpoint, CA,
// token, namespace); the broker client (*client.Client) satisfies it.
type GrantSource interface {
	Reservation(ctx context.Context, id string) (api.Reservation, error)
}

// Options configure a bridge. Zero values take the defaults.
type Options struct {
	// ClusterID is this (requester) cluster's id.
	ClusterID string
	// Grants reads the providers' grants (virtual-kubelet mode; required there).
	Grants GrantSource
	// Log is the bridge's logger (default: the manager's).
	Log logr.Logger

	// LeaseDuration of the virtual nodes' Lease in kube-node-lease (default 40s,
	// the kubelet's); it is renewed every quarter of it.
	LeaseDuration time.Duration
	// StatusSyncPeriod is how often a virtual node's status is rewritten when
	// nothing changed (default 1m); changes are written at once.
	StatusSyncPeriod time.Duration
	// ProbePeriod is how often the provider's API is checked with the granted
	// token (default 5s, at least 1s).
	ProbePeriod time.Duration
	// HeartbeatPeriod and HeartbeatLease: the bridge renews a Lease in its
	// tenant namespace at each provider every HeartbeatPeriod, claiming
	// HeartbeatLease; the provider renews this cluster's leases at the broker
	// while it sees it renewed (defaults: the reservations' renew interval
	// and lease length, 30s and 2m).
	HeartbeatPeriod, HeartbeatLease time.Duration
	// ProviderLostGrace is how long a provider's API server may leave the
	// probe unanswered while its virtual node stays Ready (default 40s):
	// brief glitches change nothing. Past it the node is Ready=Unknown and
	// tainted node.kubernetes.io/unreachable.
	ProviderLostGrace time.Duration
	// ProviderLostReplaceAfter is how long after a lost provider's last
	// answer the pods on its virtual node are deleted so that their
	// controllers replace them elsewhere (default 2m); StatefulSet pods and
	// pods annotated broker.fluidos.eu/replace-on-provider-loss: "false" stay.
	ProviderLostReplaceAfter time.Duration
	// UnschedulableAfter is how long the provider's scheduler may leave a
	// pod's copy unplaced before the pod gets a Warning Event and its
	// reservation ProviderScheduled=False (default 30s).
	UnschedulableAfter time.Duration
	// PodsPerReservation is the pod capacity each active reservation adds to its
	// virtual node (default 110, the kubelet's default).
	PodsPerReservation int64
	// KubeletAddress is where the virtual nodes' kubelet endpoints listen,
	// for `kubectl logs`, `exec`, `attach`, `port-forward` and metrics-server
	// (default ":10250"; "off" disables them): host:port is the first port,
	// each virtual node takes the lowest free one of KubeletPorts from there
	// (port 0: any free port).
	KubeletAddress string
	// KubeletPorts is the size of that port range (default 100).
	KubeletPorts int
	// MetricsPeriod is how often each virtual node lists its pods' usage
	// from the provider's metrics.k8s.io API (default 10s, at least 1s).
	MetricsPeriod time.Duration
	// NodeIP is the address the API server uses to reach that endpoint: the
	// agent pod's IP (default $POD_IP).
	NodeIP string
	// KubeletClientCA (PEM) verifies the API server's client certificate on the
	// kubelet endpoint (default: client-ca-file of
	// kube-system/extension-apiserver-authentication).
	KubeletClientCA []byte
	// KubeletServingCert is where that endpoint's serving certificate comes
	// from: "csr" (default: a CertificateSigningRequest to the cluster's
	// kubernetes.io/kubelet-serving signer, approved by the agent itself;
	// self-signed until it is issued) or "self-signed".
	KubeletServingCert string
	// KubeletServingCertTimeout is how long the CSR may wait for the signer
	// before the agent warns (log and Event) that it serves a self-signed
	// certificate (default 1m; it goes on waiting).
	KubeletServingCertTimeout time.Duration

	// LiqoNamespace maps a provider to its Liqo tenant namespace (liqo mode;
	// default "liqo-tenant-<provider>").
	LiqoNamespace func(provider string) string
}

// New returns the bridge of mode ("" means virtual-kubelet).
func New(mode string, o Options) (Bridge, error) {
	if o.ClusterID == "" {
		return nil, errors.New("bridge: the cluster id is required")
	}
	if err := api.ValidateClusterID(o.ClusterID); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	switch mode {
	case "", ModeVirtualKubelet:
		if o.Grants == nil {
			return nil, errors.New("bridge: virtual-kubelet mode needs a grant source (the broker client)")
		}
		return virtualkubelet.New(virtualkubelet.Config{
			ClusterID: o.ClusterID, Grants: o.Grants, Log: o.Log,
			LeaseDuration: o.LeaseDuration, StatusSyncPeriod: o.StatusSyncPeriod, ProbePeriod: o.ProbePeriod,
			HeartbeatPeriod: o.HeartbeatPeriod, HeartbeatLease: o.HeartbeatLease,
			PodsPerReservation: o.PodsPerReservation, UnschedulableAfter: o.UnschedulableAfter,
			ProviderLostGrace: o.ProviderLostGrace, ProviderLostReplaceAfter: o.ProviderLostReplaceAfter,
			KubeletAddress: o.KubeletAddress, KubeletPorts: o.KubeletPorts, MetricsPeriod: o.MetricsPeriod,
			NodeIP: o.NodeIP, KubeletClientCA: o.KubeletClientCA,
			KubeletServingCert: o.KubeletServingCert, KubeletServingCertTimeout: o.KubeletServingCertTimeout,
		})
	case ModeLiqo:
		return liqo.New(liqo.Config{ClusterID: o.ClusterID, Log: o.Log, TenantNamespace: o.LiqoNamespace})
	default:
		return nil, fmt.Errorf("bridge: unknown mode %q (want %q or %q)", mode, ModeVirtualKubelet, ModeLiqo)
	}
}
