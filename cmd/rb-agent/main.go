// Command rb-agent runs in every member cluster: it measures the cluster and
// advertises it to the broker, turns Reservations into broker reservations,
// and sets capacity aside for the clusters it provides to.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent"
	"github.com/fluidos-project/resource-broker/agent/bridge"
	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/agent/home"
	"github.com/fluidos-project/resource-broker/agent/metrics"
	"github.com/fluidos-project/resource-broker/agent/provider"
	"github.com/fluidos-project/resource-broker/agent/publisher"
	"github.com/fluidos-project/resource-broker/agent/reservation"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/version"
)

type options struct {
	clusterID          string
	brokerURL          string
	brokerCertDir      string
	apiServerAddress   string
	apiServerCAFile    string
	allowLocalAPI      bool
	namespace          string
	labels             map[string]string
	currency           string
	priceCPU           string
	priceMemory        string
	priceGPU           string
	tokenTTL           time.Duration
	debounce           time.Duration
	publishPeriod      time.Duration
	advertiseBand      float64
	leaderElect        bool
	bridge             string
	nodeIP             string
	kubeletAddress     string
	kubeletPorts       int
	metricsPeriod      time.Duration
	kubeletCert        string
	kubeletCertWait    time.Duration
	kubeletClientCA    string
	nodeLease          time.Duration
	unschedulableAfter time.Duration
	homeAPIServer      string
	homeTokenTTL       time.Duration
	homeTokenRefresh   time.Duration
	probePeriod        time.Duration
	lostGrace          time.Duration
	lostReplaceAfter   time.Duration
	nodeStatusPeriod   time.Duration
	metricsAddr        string
	metricsSecure      bool
	metricsCertDir     string
	probeAddr          string
	pprofAddr          string
	reserveWorkers     int
	providerHold       bool
	holdPriority       int32
	placeholderImage   string
	holdTimeout        time.Duration
	evictionGrace      time.Duration
	massExpiryHold     time.Duration
	leaseLength        time.Duration
	holdTime           time.Duration
	renewInterval      time.Duration
	returnHome         string
	returnHomeMinStay  time.Duration
	returnHomeCooldown time.Duration
	podNetwork         string
	homeDNS            string
	clusterDomain      string
	logging            *logsapi.LoggingConfiguration
}

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "rb-agent:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	o := options{logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:           "rb-agent",
		Short:         "The resource-broker agent of one member cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          func(cmd *cobra.Command, _ []string) error { return run(o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.clusterID, "cluster-id", "", "this cluster's id (a DNS label such as rome); must equal the CN of the broker client certificate")
	f.StringVar(&o.brokerURL, "broker-url", "", "the broker's API, e.g. https://rb-broker.example:443")
	f.StringVar(&o.brokerCertDir, "broker-cert-dir", "/etc/rb-agent/tls", "directory with tls.crt, tls.key and ca.crt for the broker")
	f.StringVar(&o.apiServerAddress, "api-server-address", "",
		"https:// URL of this cluster's API server as requesters in other clusters reach it, advertised and handed to them in grants (default: the kubeconfig's, which in a pod is only reachable inside this cluster: the agent refuses to start with it)")
	f.StringVar(&o.apiServerCAFile, "api-server-ca-file", "",
		"PEM file of the CA requesters verify the API server at --api-server-address with (default: the kubeconfig's CA, in a pod the service account's ca.crt)")
	f.BoolVar(&o.allowLocalAPI, "allow-local-api-server-address", false,
		"advertise an API server address only this cluster reaches (the ClusterIP of Service kubernetes, a .svc name, a pod's loopback): for test beds whose requesters share this cluster's network")
	f.StringVar(&o.apiServerAddress, "endpoint", "", "")
	_ = f.MarkDeprecated("endpoint", "use --api-server-address")
	f.StringVar(&o.namespace, "namespace", envOr("POD_NAMESPACE", "resource-broker"), "namespace of the agent's ProviderInstructions")
	f.StringToStringVar(&o.labels, "labels", nil, "labels to advertise; pods that require node labels are matched on kubernetes.io/arch, kubernetes.io/os, topology.kubernetes.io/region, topology.kubernetes.io/zone and nvidia.com/gpu.product, e.g. topology.kubernetes.io/region=eu-west,kubernetes.io/arch=amd64")
	f.StringVar(&o.currency, "currency", "EUR", "ISO 4217 currency of the prices")
	f.StringVar(&o.priceCPU, "price-cpu", "", "price of one core for one hour, e.g. 0.031")
	f.StringVar(&o.priceMemory, "price-memory", "", "price of one GiB for one hour, e.g. 0.004")
	f.StringVar(&o.priceGPU, "price-gpu", "", "price of one GPU for one hour, e.g. 0.90")
	f.DurationVar(&o.tokenTTL, "token-ttl", time.Hour, "lifetime of the tokens granted to requesters (at least 10m; renewed after two thirds)")
	f.DurationVar(&o.debounce, "debounce", time.Second, "how long a change settles before it is advertised")
	f.DurationVar(&o.publishPeriod, "publish-period", 30*time.Second, "advertise at least this often, aligned to the wall clock")
	f.Float64Var(&o.advertiseBand, "advertise-band", publisher.DefaultBand,
		"send the advertisement again once a node's or the cluster's used cpu, memory or storage moved by more than this fraction of its allocatable (anything else that changes always sends it); until then each period sends a heartbeat. Negative: every publish is a full advertisement")
	f.BoolVar(&o.leaderElect, "leader-elect", true, "elect one active agent among replicas")
	f.StringVar(&o.bridge, "bridge", bridge.ModeVirtualKubelet, "how won reservations become nodes: virtual-kubelet, liqo, or none")
	f.StringVar(&o.nodeIP, "node-ip", os.Getenv("POD_IP"), "address the API server uses to reach the virtual nodes' kubelet endpoint (this pod's IP)")
	f.StringVar(&o.kubeletAddress, "kubelet-address", ":10250",
		"first listen address of the virtual nodes' kubelet endpoints (kubectl logs, exec, attach, port-forward, metrics-server): each node takes the lowest free port of --kubelet-ports from there; off to disable")
	f.IntVar(&o.kubeletPorts, "kubelet-ports", 100, "how many ports from --kubelet-address the virtual nodes' kubelet endpoints may take, one per node")
	f.DurationVar(&o.metricsPeriod, "provider-metrics-period", 10*time.Second,
		"how often each virtual node lists its pods' usage from the provider's metrics.k8s.io API (kubectl top, HorizontalPodAutoscalers; at least 1s)")
	f.StringVar(&o.kubeletCert, "kubelet-serving-cert", virtualkubelet.ServingCertCSR,
		"serving certificate of the kubelet endpoint: csr (a CertificateSigningRequest to the kubernetes.io/kubelet-serving signer, approved by the agent; self-signed until issued) or self-signed")
	f.DurationVar(&o.kubeletCertWait, "kubelet-serving-cert-timeout", time.Minute,
		"how long the serving certificate's CSR may wait for the signer before the agent warns that it serves a self-signed one (it goes on waiting)")
	f.StringVar(&o.kubeletClientCA, "kubelet-client-ca", "",
		"PEM file of the CA whose client certificates the kubelet endpoint accepts (default: client-ca-file of kube-system/extension-apiserver-authentication)")
	f.DurationVar(&o.nodeLease, "virtual-node-lease", 40*time.Second, "lease duration of the virtual nodes")
	f.DurationVar(&o.probePeriod, "provider-probe-period", 5*time.Second, "how often a provider's API is checked with its grant (at least 1s)")
	f.DurationVar(&o.lostGrace, "provider-lost-grace", 40*time.Second,
		"how long a provider's API server may leave the probe unanswered while its virtual node stays Ready; then the node is Ready=Unknown and tainted node.kubernetes.io/unreachable (at least --provider-probe-period)")
	f.DurationVar(&o.lostReplaceAfter, "provider-lost-replace-after", 2*time.Minute,
		"how long after a lost provider's last answer the pods on its virtual node are deleted so that their controllers replace them elsewhere "+
			"(at least --provider-lost-grace; StatefulSet pods and pods annotated broker.fluidos.eu/replace-on-provider-loss=false stay)")
	f.DurationVar(&o.unschedulableAfter, "provider-unschedulable-after", 30*time.Second,
		"how long a provider's scheduler may leave a pod's copy unplaced before the pod and its reservation say so")
	f.DurationVar(&o.nodeStatusPeriod, "virtual-node-status-period", time.Minute, "how often an unchanged virtual node status is rewritten")
	f.StringVar(&o.homeAPIServer, "home-api-server", "",
		"this cluster's API server as the providers' pods reach it, https://host:port: where borrowed pods' in-cluster config points "+
			"(default: the address and port of EndpointSlice default/kubernetes, which the API server advertises)")
	f.DurationVar(&o.homeTokenTTL, "home-api-token-ttl", virtualkubelet.DefaultHomeTokenTTL,
		"lifetime of the ServiceAccount tokens borrowed pods get to call this cluster's API, renewed at 80 % of it (at least 10m)")
	f.DurationVar(&o.homeTokenRefresh, "home-api-token-refresh", 0,
		"renew those tokens this often instead, when shorter than 80 % of their lifetime (0: at 80 %)")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "address of /metrics (0: off)")
	f.BoolVar(&o.metricsSecure, "metrics-secure", true,
		"serve /metrics over https to callers the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the non-resource URL /metrics), "+
			"as Kubernetes components do; false: plain HTTP to anyone")
	f.StringVar(&o.metricsCertDir, "metrics-cert-dir", "",
		"directory with tls.crt and tls.key of the https /metrics, read again when they change (default: a self-signed certificate, which scrapers must not verify)")
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "healthz/readyz address")
	f.StringVar(&o.pprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof endpoints, e.g. 127.0.0.1:6060 (empty or 0: off)")
	f.IntVar(&o.reserveWorkers, "reservation-workers", agent.DefaultReservationWorkers,
		"Reservations reconciled at once (the controller's MaxConcurrentReconciles; each mostly waits for the broker and the API server)")
	f.BoolVar(&o.providerHold, "provider-hold", true,
		"hold each provided reservation's capacity with a placeholder pod (PriorityClass rb-placeholder) and pin its tenant pod to the placeholder's node at rb-tenant; false: no placeholders, grants without placement")
	f.Int32Var(&o.holdPriority, "hold-priority", provider.DefaultHoldPriority,
		"value of the rb-placeholder PriorityClass (preemptionPolicy Never; rb-tenant is one more): above this cluster's ordinary workloads, below 1000000000")
	f.StringVar(&o.placeholderImage, "placeholder-image", provider.DefaultPlaceholderImage, "image of the placeholder pods (a pause image)")
	f.DurationVar(&o.holdTimeout, "hold-timeout", provider.DefaultHoldTimeout,
		"how long a reservation's first grant waits for its placeholder to be bound; then it is granted without placement (a later grant carries it)")
	f.DurationVar(&o.evictionGrace, "eviction-grace", provider.DefaultEvictionGrace,
		"how long the tenant pods of a provided reservation that ended (lease lapsed, released) may still run before they are evicted")
	f.DurationVar(&o.massExpiryHold, "mass-expiry-hold", provider.DefaultMassExpiryHold,
		"how long the evictions wait when many provided leases lapse at once (3 or more within a minute, of several requesters or most of one's): a broker or network fault is likelier than every requester gone; 0: never held")
	f.DurationVar(&o.leaseLength, "lease-length", reservation.DefaultLeaseLength,
		"lease of a reservation opened for a pod: the broker ends it this long after its last renewal (renewed while the pod is bound and runs)")
	f.DurationVar(&o.holdTime, "hold-time", reservation.DefaultHoldTime,
		"how long a reservation opened for a pod is held, once decided, for the pod to be bound (a Reservation's spec.duration overrides it)")
	f.DurationVar(&o.renewInterval, "lease-renew-interval", reservation.DefaultRenewInterval,
		"how often the leases of bound, running pods are renewed, in batches (at most a third of --lease-length and of --hold-time)")
	f.StringVar(&o.returnHome, "return-home", home.PolicyNever,
		"return-home policy of borrowed pods where neither the pod nor its namespace says (annotation "+home.PolicyAnnotation+"): "+
			home.PolicyNever+", or "+home.PolicyWhenLocalFits+" (a borrowed pod of a Deployment moves home, replacement first, once a local node can hold it)")
	f.DurationVar(&o.returnHomeMinStay, "return-home-min-stay", 0,
		"least time a borrowed pod stays at its provider before it may move home, where neither the pod nor its namespace says (annotation "+home.MinStayAnnotation+")")
	f.DurationVar(&o.returnHomeCooldown, "return-home-cooldown", home.DefaultCooldown, "least time between two moves home of one Deployment's pods")
	f.StringVar(&o.podNetwork, "borrowed-pod-network", networkProvider,
		"the network view of borrowed pods (virtual-kubelet bridge): provider (its DNS and Services) or home (this cluster's DNS, with the home namespace's search path, and Service environment variables; needs this cluster's service CIDR routed from the providers' pods)")
	f.StringVar(&o.homeDNS, "home-dns", "", "with --borrowed-pod-network=home: this cluster's DNS server address (default: the ClusterIP of kube-system/kube-dns)")
	f.StringVar(&o.clusterDomain, "cluster-domain", "cluster.local", "this cluster's DNS domain (--borrowed-pod-network=home)")
	// Kubernetes components' logging flags (--logging-format, -v, --vmodule),
	// without klog's legacy ones.
	logsapi.AddFlags(o.logging, f)
	f.AddGoFlagSet(flag.CommandLine) // controller-runtime's --kubeconfig
	version.AddFlag(cmd)
	return cmd
}

// metricsOptions are those of controller-runtime's metrics server: with
// --metrics-secure, https and the API server's authentication and
// authorization of every scrape (a Prometheus ServiceAccount bound to a
// ClusterRole with get on /metrics, see manifests/monitoring).
func (o options) metricsOptions() metricsserver.Options {
	mo := metricsserver.Options{BindAddress: o.metricsAddr}
	if o.metricsSecure {
		mo.SecureServing, mo.FilterProvider, mo.CertDir = true, filters.WithAuthenticationAndAuthorization, o.metricsCertDir
	}
	return mo
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// prices parses the price flags with apimachinery quantities.
func (o options) prices() (*api.Prices, error) {
	p := &api.Prices{Currency: o.currency}
	for flagName, spec := range map[string]struct {
		value string
		dst   **resource.Quantity
	}{"--price-cpu": {o.priceCPU, &p.CPU}, "--price-memory": {o.priceMemory, &p.Memory}, "--price-gpu": {o.priceGPU, &p.GPU}} {
		if spec.value == "" {
			continue
		}
		q, err := resource.ParseQuantity(spec.value)
		if err != nil || q.Sign() < 0 {
			return nil, fmt.Errorf("%s %q: want a non-negative decimal such as 0.031", flagName, spec.value)
		}
		*spec.dst = &q
	}
	return p, nil
}

func (o options) validate() error {
	var errs []error
	if o.clusterID == "" {
		errs = append(errs, errors.New("--cluster-id is required"))
	}
	if o.brokerURL == "" {
		errs = append(errs, errors.New("--broker-url is required"))
	} else if !strings.HasPrefix(o.brokerURL, "https://") {
		errs = append(errs, fmt.Errorf("--broker-url %q: the broker is only reachable over https://", o.brokerURL))
	}
	if _, err := o.prices(); err != nil {
		errs = append(errs, err)
	}
	if o.advertiseBand >= 1 {
		errs = append(errs, errors.New("--advertise-band must be below 1 (a fraction of allocatable; negative turns heartbeats off)"))
	}
	if o.debounce <= 0 || o.publishPeriod <= 0 {
		errs = append(errs, errors.New("--debounce and --publish-period must be positive"))
	}
	if o.kubeletCert != virtualkubelet.ServingCertCSR && o.kubeletCert != virtualkubelet.ServingCertSelfSigned {
		errs = append(errs, fmt.Errorf("--kubelet-serving-cert %q: want %s or %s", o.kubeletCert, virtualkubelet.ServingCertCSR, virtualkubelet.ServingCertSelfSigned))
	}
	if o.kubeletCertWait <= 0 {
		errs = append(errs, errors.New("--kubelet-serving-cert-timeout must be positive"))
	}
	if o.homeTokenRefresh < 0 {
		errs = append(errs, fmt.Errorf("--home-api-token-refresh %s: must not be negative", o.homeTokenRefresh))
	}
	if o.homeTokenTTL < virtualkubelet.MinHomeTokenTTL {
		errs = append(errs, fmt.Errorf("--home-api-token-ttl %s: at least %s", o.homeTokenTTL, virtualkubelet.MinHomeTokenTTL))
	}
	if o.kubeletPorts < 1 {
		errs = append(errs, fmt.Errorf("--kubelet-ports %d: want at least 1", o.kubeletPorts))
	}
	if o.bridge == bridge.ModeVirtualKubelet && (o.lostGrace < o.probePeriod || o.lostReplaceAfter < o.lostGrace) {
		errs = append(errs, fmt.Errorf("--provider-lost-grace %s and --provider-lost-replace-after %s: want --provider-probe-period %s <= grace <= replace-after",
			o.lostGrace, o.lostReplaceAfter, o.probePeriod))
	}
	if o.metricsPeriod < time.Second {
		errs = append(errs, fmt.Errorf("--provider-metrics-period %s: want at least 1s", o.metricsPeriod))
	}
	if o.massExpiryHold < 0 {
		errs = append(errs, fmt.Errorf("--mass-expiry-hold must not be negative, got %s", o.massExpiryHold))
	}
	if o.holdTimeout <= 0 || o.evictionGrace < 0 {
		errs = append(errs, errors.New("--hold-timeout must be positive and --eviction-grace not negative"))
	}
	if o.returnHome != home.PolicyNever && o.returnHome != home.PolicyWhenLocalFits {
		errs = append(errs, fmt.Errorf("--return-home %q: want %s or %s", o.returnHome, home.PolicyNever, home.PolicyWhenLocalFits))
	}
	if o.podNetwork != networkProvider && o.podNetwork != networkHome {
		errs = append(errs, fmt.Errorf("--borrowed-pod-network %q: want %s or %s", o.podNetwork, networkProvider, networkHome))
	}
	if o.homeDNS != "" && net.ParseIP(o.homeDNS) == nil {
		errs = append(errs, fmt.Errorf("--home-dns %q: not an IP address", o.homeDNS))
	}
	if o.returnHomeMinStay < 0 || o.returnHomeCooldown <= 0 {
		errs = append(errs, errors.New("--return-home-min-stay must not be negative and --return-home-cooldown must be positive"))
	}
	if o.reserveWorkers < 1 {
		errs = append(errs, fmt.Errorf("--reservation-workers %d: want at least 1", o.reserveWorkers))
	}
	if o.leaseLength <= 0 || o.holdTime <= 0 || o.renewInterval <= 0 {
		errs = append(errs, errors.New("--lease-length, --hold-time and --lease-renew-interval must be positive"))
	} else {
		lo := agent.Options{LeaseLength: o.leaseLength, HoldTime: o.holdTime, RenewInterval: o.renewInterval}
		errs = append(errs, lo.ValidateLease())
	}
	return errors.Join(errs...)
}

func run(o options) error {
	if err := logsapi.ValidateAndApply(o.logging, nil); err != nil {
		return err
	}
	defer logs.FlushLogs()
	if err := o.validate(); err != nil {
		return err
	}
	ctrl.SetLogger(klog.NewKlogr())
	bc, err := brokerclient.New(o.brokerURL, o.brokerCertDir)
	if err != nil {
		return fmt.Errorf("broker client: %w", err)
	}
	prices, _ := o.prices()
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	ao := agent.Options{
		ClusterID: o.clusterID, Broker: bc, Namespace: o.namespace,
		Labels: o.labels, Prices: prices, TokenTTL: o.tokenTTL, Debounce: o.debounce, PublishPeriod: o.publishPeriod, AdvertiseBand: o.advertiseBand,
		ReservationWorkers: o.reserveWorkers, LeaseLength: o.leaseLength, HoldTime: o.holdTime, RenewInterval: o.renewInterval,
		NoProviderHold: !o.providerHold, HoldPriority: o.holdPriority, PlaceholderImage: o.placeholderImage,
		// 0 means the default there: a nanosecond is "at once".
		HoldTimeout: o.holdTimeout, EvictionGrace: max(o.evictionGrace, time.Nanosecond),
		MassExpiryHold: massExpiryHold(o.massExpiryHold),
		ReturnHome:     o.returnHome, ReturnHomeMinStay: o.returnHomeMinStay, ReturnHomeCooldown: o.returnHomeCooldown,
	}
	if o.bridge != "none" {
		ao.Bridge = o.bridge
		ao.BridgeOptions = bridge.Options{VirtualKubelet: virtualkubelet.Config{LeaseDuration: o.nodeLease, ProbePeriod: o.probePeriod, UnschedulableAfter: o.unschedulableAfter,
			HeartbeatPeriod: o.renewInterval, HeartbeatLease: o.leaseLength,
			ProviderLostGrace: o.lostGrace, ProviderLostReplaceAfter: o.lostReplaceAfter, StatusSyncPeriod: o.nodeStatusPeriod,
			KubeletAddress: o.kubeletAddress, KubeletPorts: o.kubeletPorts, MetricsPeriod: o.metricsPeriod, NodeIP: o.nodeIP, KubeletServingCert: o.kubeletCert, KubeletServingCertTimeout: o.kubeletCertWait,
			HomeAPIServer: o.homeAPIServer, HomeTokenTTL: o.homeTokenTTL, HomeTokenRefresh: o.homeTokenRefresh}}
		if o.kubeletClientCA != "" {
			if ao.BridgeOptions.VirtualKubelet.KubeletClientCA, err = os.ReadFile(o.kubeletClientCA); err != nil {
				return fmt.Errorf("--kubelet-client-ca: %w", err)
			}
		}
		if o.podNetwork == networkHome {
			if ao.BridgeOptions.VirtualKubelet.HomeNetwork, err = homeNetwork(context.Background(), cfg, o.homeDNS, o.clusterDomain); err != nil {
				return err
			}
		}
	}
	// What requesters are handed: an address they can reach, or no start.
	apiServer, err := agent.APIServerFrom(cfg, o.apiServerAddress, o.apiServerCAFile)
	if err != nil {
		return err
	}
	warning, err := agent.CheckAPIServerAddress(apiServer.Address, agent.LocalityOf(cfg, os.Getenv), o.allowLocalAPI)
	if err != nil {
		return err
	}
	if warning != "" {
		klog.InfoS("Warning: the API server address handed to requesters may not reach this cluster from theirs", "address", apiServer.Address, "reason", warning)
	}
	ao.Endpoint, ao.CABundle = apiServer.Address, apiServer.CABundle
	if err := ao.Validate(); err != nil { // before the manager: a wrong identity must fail fast
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := rbv1.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   agent.CacheOptions(o.namespace),
		Metrics:                 o.metricsOptions(),
		HealthProbeBindAddress:  o.probeAddr,
		PprofBindAddress:        o.pprofAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "rb-agent." + rbv1.GroupVersion.Group,
		LeaderElectionNamespace: o.namespace,
	})
	if err != nil {
		return err
	}
	if err := agent.Setup(mgr, ao); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	metrics.Info.WithLabelValues(o.clusterID, version.Get().Version).Set(1)
	klog.InfoS("starting rb-agent", "version", version.Get().Version, "cluster", o.clusterID, "broker", o.brokerURL, "endpoint", ao.Endpoint)
	return mgr.Start(ctrl.SetupSignalHandler())
}

// massExpiryHold maps the flag (0: never held) to the option (negative: never held).
func massExpiryHold(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// The views of the network a borrowed pod may have (--borrowed-pod-network).
const (
	networkProvider = "provider"
	networkHome     = "home"
)

// homeNetwork is the home network view: dns, or the ClusterIP of
// kube-system/kube-dns.
func homeNetwork(ctx context.Context, cfg *rest.Config, dns, domain string) (*virtualkubelet.HomeNetwork, error) {
	if dns == "" {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		svc, err := cs.CoreV1().Services(metav1.NamespaceSystem).Get(ctx, "kube-dns", metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("--borrowed-pod-network=home: this cluster's DNS (Service kube-system/kube-dns): %w; name it with --home-dns", err)
		}
		dns = svc.Spec.ClusterIP
	}
	return &virtualkubelet.HomeNetwork{DNS: dns, ClusterDomain: domain}, nil
}
