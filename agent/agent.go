// Package agent wires the parts of rb-agent, the one component in a member
// cluster that talks to the broker: the collector and publisher (what this
// cluster offers), the Reservation reconciler (requester side), the tenant
// reconciler (provider side) and the follower of the broker's event stream.
package agent

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge"
	"github.com/fluidos-project/resource-broker/agent/collector"
	"github.com/fluidos-project/resource-broker/agent/follower"
	"github.com/fluidos-project/resource-broker/agent/home"
	"github.com/fluidos-project/resource-broker/agent/provider"
	"github.com/fluidos-project/resource-broker/agent/publisher"
	"github.com/fluidos-project/resource-broker/agent/reservation"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// Options configure an agent.
type Options struct {
	// ClusterID is this cluster's identity; it must equal the CN of the broker client certificate.
	ClusterID string
	// Broker is the broker client (mutual TLS with this cluster's certificate).
	Broker *brokerclient.Client
	// Namespace holds the agent's own objects (ProviderInstructions).
	Namespace string
	// Endpoint is this cluster's API server URL as requesters reach it; CABundle its CA.
	Endpoint string
	CABundle []byte
	// Labels and Prices are advertised to the broker.
	Labels map[string]string
	Prices *api.Prices
	// TokenTTL is the lifetime of tokens granted to requesters (default 1h).
	TokenTTL time.Duration
	// Debounce and PublishPeriod pace the advertisement (defaults 1s and 30s).
	Debounce, PublishPeriod time.Duration
	// AdvertiseBand: how far (a fraction of allocatable) used figures may
	// drift from the advertisement the broker holds before it is sent
	// again; until then a period sends a heartbeat (publisher.Config.Band).
	AdvertiseBand float64
	// MinBackoff and MaxBackoff pace retries of refused reservations (defaults 1s, 30s);
	// one refused for lack of capacity is retried at least every 2s
	// (reservation.DefaultWaitingRetry) to keep its place on the broker's waiting list.
	MinBackoff, MaxBackoff time.Duration
	// ReserveBroker, when set, replaces Broker for the Reservation reconciler (tests inject faults).
	ReserveBroker reservation.Broker
	// ReservationWorkers is how many Reservations are reconciled at once
	// (the controller's MaxConcurrentReconciles; default DefaultReservationWorkers).
	// One object is never reconciled by two workers at the same time.
	ReservationWorkers int
	// LeaseLength, HoldTime and RenewInterval shape the lease of a
	// Reservation opened for a pod (defaults reservation.DefaultLeaseLength,
	// DefaultHoldTime and DefaultRenewInterval): the broker holds it
	// HoldTime for its pod to be bound, then LeaseLength after each renewal;
	// the agent renews every RenewInterval, at most a third of either.
	LeaseLength, HoldTime, RenewInterval time.Duration
	// RenewBroker, when set, replaces Broker for lease renewals (tests).
	RenewBroker reservation.Renewing
	// Bridge is how won reservations become nodes (bridge.ModeVirtualKubelet or
	// bridge.ModeLiqo); empty: no bridge.
	Bridge string
	// BridgeOptions tune the bridge; Setup fills ClusterID and the grant source.
	BridgeOptions bridge.Options
	// ReturnHome is the default return-home policy of borrowed pods
	// (home.PolicyNever when empty; pods and namespaces may say otherwise),
	// ReturnHomeMinStay the default least stay at a provider and
	// ReturnHomeCooldown the least time between two moves of one Deployment.
	ReturnHome                            string
	ReturnHomeMinStay, ReturnHomeCooldown time.Duration
	// NoProviderHold turns the provider-side hold off (--provider-hold=false):
	// no placeholder pods, grants without placement.
	NoProviderHold bool
	// HoldPriority is the value of the rb-placeholder PriorityClass
	// (rb-tenant is one more; default provider.DefaultHoldPriority).
	HoldPriority int32
	// PlaceholderImage, HoldTimeout and EvictionGrace tune the provider side
	// (defaults in package provider).
	PlaceholderImage string
	HoldTimeout      time.Duration
	EvictionGrace    time.Duration
	// MassExpiryHold is how long the evictions of a mass expiry wait
	// (provider.TenantReconciler.MassExpiryHold; default 10m, negative: none).
	MassExpiryHold time.Duration
}

// DefaultReservationWorkers is the default of Options.ReservationWorkers. A
// reconcile mostly waits: one broker call and one or two API writes, about
// 30-50 ms, so a single worker caps a burst at 20-35 reservations/s.
const DefaultReservationWorkers = 8

// Validate checks the options, including that the identity matches the certificate.
func (o *Options) Validate() error {
	var errs []error
	if o.ClusterID == "" {
		errs = append(errs, errors.New("--cluster-id is required"))
	} else if err := api.ValidateClusterID(o.ClusterID); err != nil {
		errs = append(errs, fmt.Errorf("--cluster-id: %w", err))
	}
	if o.Broker == nil {
		errs = append(errs, errors.New("a broker client is required"))
	} else if cn := o.Broker.Identity(); o.ClusterID != "" && cn != o.ClusterID {
		errs = append(errs, fmt.Errorf("--cluster-id %q differs from the broker certificate's CN %q: the broker would see this cluster as %q", o.ClusterID, cn, cn))
	}
	if o.Namespace == "" {
		errs = append(errs, errors.New("--namespace is required"))
	}
	if o.Endpoint == "" {
		errs = append(errs, errors.New("the API server address is unknown: set --api-server-address"))
	}
	if o.Bridge != "" && !slices.Contains(bridge.Modes, o.Bridge) {
		errs = append(errs, fmt.Errorf("--bridge %q: want virtual-kubelet, liqo or none", o.Bridge))
	}
	if o.ReservationWorkers < 0 {
		errs = append(errs, fmt.Errorf("ReservationWorkers %d: want at least 1 (0: the default)", o.ReservationWorkers))
	}
	if o.HoldPriority < 0 || o.HoldPriority >= 1000000000 {
		errs = append(errs, fmt.Errorf("--hold-priority %d: want 0 to 999999999 (user PriorityClasses stop below 1000000000)", o.HoldPriority))
	}
	if o.HoldTimeout < 0 || o.EvictionGrace < 0 {
		errs = append(errs, errors.New("--hold-timeout and --eviction-grace must not be negative"))
	}
	errs = append(errs, o.ValidateLease())
	if o.TokenTTL != 0 && o.TokenTTL < 10*time.Minute {
		errs = append(errs, fmt.Errorf("--token-ttl %s is below the TokenRequest minimum of 10m", o.TokenTTL))
	}
	return errors.Join(errs...)
}

// ValidateLease checks the lease knobs, defaults in place of zeros: a
// renewal interval well below the lease length and the hold time, so that
// a lease outlives a few missed rounds.
func (o *Options) ValidateLease() error {
	lease, hold, every := cmp.Or(o.LeaseLength, reservation.DefaultLeaseLength), cmp.Or(o.HoldTime, reservation.DefaultHoldTime),
		cmp.Or(o.RenewInterval, reservation.DefaultRenewInterval)
	var errs []error
	if lease < 0 || hold < 0 || every < 0 {
		return errors.New("--lease-length, --hold-time and --lease-renew-interval must be positive")
	}
	if lease < time.Second {
		errs = append(errs, fmt.Errorf("--lease-length %s: want at least 1s", lease))
	}
	if every > lease/3 {
		errs = append(errs, fmt.Errorf("--lease-renew-interval %s: want at most a third of --lease-length %s, so that a lease survives two missed renewals", every, lease))
	}
	if every > hold/3 {
		errs = append(errs, fmt.Errorf("--lease-renew-interval %s: want at most a third of --hold-time %s", every, hold))
	}
	return errors.Join(errs...)
}

// EndpointFrom fills Endpoint and CABundle from a rest config when unset
// (an agent run in process, by tests). rb-agent uses APIServerFrom and
// CheckAPIServerAddress: flags, the CA file, and no cluster-local address.
func (o *Options) EndpointFrom(cfg *rest.Config) {
	if o.Endpoint == "" {
		o.Endpoint = cfg.Host
	}
	if len(o.CABundle) == 0 {
		o.CABundle = cfg.CAData
	}
}

// CacheOptions are the options of the manager's cache that rb-agent runs
// with (ctrl.Options.Cache). Objects enter the cache without their
// managedFields, which nothing in the agent reads (an update that sends none
// keeps the server's). Nodes, of which the manager caches every one of the
// cluster's (the bridge watches them for its virtual nodes, and reads only
// their metadata), also leave out status.images, volumesInUse and
// volumesAttached: a real node lists up to 50 images, most of its size. The
// collector does not use this cache: it has its own, reduced to a few numbers
// per object (agent/collector). ProviderInstructions are read in namespace,
// the agent's, only (its RBAC allows no more).
func CacheOptions(namespace string) cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Node{}: {Transform: slimNode},
			// Only the pods of reservations (placeholders and tenant pods,
			// which carry the reservation label): the tenant reconciler's.
			&corev1.Pod{}:               {Label: reservationPods},
			&rbv1.ProviderInstruction{}: {Namespaces: map[string]cache.Config{namespace: {}}},
		},
	}
}

var reservationPods = func() labels.Selector {
	req, err := labels.NewRequirement(rbv1.ReservationLabel, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*req)
}()

// slimNode is the manager cache's transform of Nodes (see CacheOptions).
func slimNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images, n.Status.VolumesInUse, n.Status.VolumesAttached = nil, nil, nil
	}
	return obj, nil
}

// Setup registers every part of the agent with mgr.
func Setup(mgr ctrl.Manager, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	var rb reservation.Broker = o.Broker
	if o.ReserveBroker != nil {
		rb = o.ReserveBroker
	}
	pods, err := reservation.NewPodTracker(mgr)
	if err != nil {
		return fmt.Errorf("pod tracker: %w", err)
	}
	rec := &reservation.Reconciler{
		Client: mgr.GetClient(), Broker: rb, Recorder: mgr.GetEventRecorder("rb-agent"),
		MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, MaxConcurrentReconciles: o.ReservationWorkers,
		LeaseLength: o.LeaseLength, HoldTime: o.HoldTime, Pods: pods,
	}
	if rec.MaxConcurrentReconciles == 0 {
		rec.MaxConcurrentReconciles = DefaultReservationWorkers
	}
	if err := rec.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("reservation reconciler: %w", err)
	}
	var renew reservation.Renewing = o.Broker
	if o.RenewBroker != nil {
		renew = o.RenewBroker
	}
	renewer := &reservation.Renewer{Client: mgr.GetClient(), Broker: renew, Pods: pods, Enqueue: rec.Enqueue,
		Interval: o.RenewInterval, Log: mgr.GetLogger().WithName("renewer")}
	coll := collector.New(collector.Options{})
	homeRec := &home.Reconciler{Client: mgr.GetClient(), Pods: pods, Local: coll, Recorder: mgr.GetEventRecorder("rb-agent"),
		DefaultPolicy: cmp.Or(o.ReturnHome, home.PolicyNever), MinStay: o.ReturnHomeMinStay, Cooldown: o.ReturnHomeCooldown}
	if err := homeRec.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("home reconciler: %w", err)
	}
	pods.OnEnded, pods.OnChanged = rec.EnqueueAll, homeRec.Enqueue
	pods.OnBound = func(keys []types.NamespacedName) {
		renewer.Bound(keys)
		homeRec.Enqueue(keys)
	}
	if err := mgr.Add(renewer); err != nil {
		return fmt.Errorf("renewer: %w", err)
	}
	if o.Broker != nil {
		protector := &reservation.Protector{Client: mgr.GetClient(), Pods: mgr.GetAPIReader(), Broker: o.Broker,
			Log: mgr.GetLogger().WithName("protector")}
		if err := mgr.Add(protector); err != nil {
			return fmt.Errorf("protector: %w", err)
		}
	}
	if o.Bridge != "" {
		bo := o.BridgeOptions
		bo.ClusterID, bo.VirtualKubelet.Grants = o.ClusterID, o.Broker
		br, err := bridge.New(o.Bridge, bo)
		if err != nil {
			return err
		}
		if err := br.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
	}
	// The tenant policy (and the hold's PriorityClasses) before any tenant.
	policy := &provider.ClusterObjects{Client: mgr.GetClient()}
	if !o.NoProviderHold {
		policy.HoldPriority = cmp.Or(o.HoldPriority, provider.DefaultHoldPriority)
	}
	if err := mgr.Add(policy); err != nil {
		return err
	}
	tenants := &provider.TenantReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Broker: o.Broker, Recorder: mgr.GetEventRecorder("rb-agent"),
		Namespace: o.Namespace, Endpoint: o.Endpoint, CABundle: o.CABundle, TokenTTL: o.TokenTTL,
		Hold: !o.NoProviderHold, PlaceholderImage: o.PlaceholderImage, HoldTimeout: o.HoldTimeout, EvictionGrace: o.EvictionGrace,
		MassExpiryHold: o.MassExpiryHold, PolicyReady: policy.Ready,
	}
	if o.Broker != nil {
		tenants.Clusters = o.Broker // which requesters pin their pods (Liqo's do not)
		// The requesters this cluster still hears keep their leases, renewed
		// from here as often as they renew them themselves.
		tenants.Requesters = &provider.Requesters{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Broker: o.Broker,
			Namespace: o.Namespace, Period: o.RenewInterval, Log: mgr.GetLogger().WithName("requesters")}
		if err := mgr.Add(tenants.Requesters); err != nil {
			return err
		}
	}
	if err := tenants.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("tenant reconciler: %w", err)
	}
	if err := mgr.Add(&follower.Follower{
		Broker: o.Broker, Client: mgr.GetClient(), ClusterID: o.ClusterID, Namespace: o.Namespace, Reservations: rec,
		Recorder: mgr.GetEventRecorder("rb-agent"), APIReader: mgr.GetAPIReader(),
	}); err != nil {
		return err
	}
	if err := coll.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("collector: %w", err)
	}
	labels := o.Labels
	if o.Bridge == bridge.ModeLiqo {
		// Liqo places the offloaded pods itself, unpinned: providers hold
		// nothing for this cluster (a placeholder would hold twice).
		labels = maps.Clone(o.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[rbv1.BridgeLabel] = bridge.ModeLiqo
	}
	pub, err := publisher.New(publisher.Config{
		ClusterID: o.ClusterID, Endpoint: o.Endpoint, Labels: labels, Prices: publisher.PricesFromWire(o.Prices),
		Debounce: o.Debounce, Period: o.PublishPeriod, Band: o.AdvertiseBand, Source: coll, Broker: o.Broker,
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("rb-agent"),
	})
	if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	return pub.SetupWithManager(mgr)
}
