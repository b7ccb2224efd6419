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
	// Log is the bridge's logger (default: the manager's).
	Log logr.Logger
	// VirtualKubelet tunes the virtual-kubelet bridge; its ClusterID and Log
	// are the ones above, and its Grants (the providers' grants, read from
	// the broker) are required.
	VirtualKubelet virtualkubelet.Config
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
		if o.VirtualKubelet.Grants == nil {
			return nil, errors.New("bridge: virtual-kubelet mode needs a grant source (the broker client)")
		}
		cfg := o.VirtualKubelet
		cfg.ClusterID, cfg.Log = o.ClusterID, o.Log
		return virtualkubelet.New(cfg)
	case ModeLiqo:
		return liqo.New(liqo.Config{ClusterID: o.ClusterID, Log: o.Log, TenantNamespace: o.LiqoNamespace})
	default:
		return nil, fmt.Errorf("bridge: unknown mode %q (want %q or %q)", mode, ModeVirtualKubelet, ModeLiqo)
	}
}
