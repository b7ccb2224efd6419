package virtualkubelet

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// A borrowed pod calls its home cluster's API as it would at home: its copy
// gets, where the kubelet would mount its ServiceAccount's token, a token of
// the same ServiceAccount in this cluster, bound to the pod, and environment
// variables that point client-go's in-cluster config at this cluster's API
// server. The token is requested here (TokenRequest), carried to the provider
// in a Secret named after the copy and renewed before it expires.

const (
	// HomeAPIAnnotation: "false" on a pod leaves its copy without the home
	// token (no token at all, as before).
	HomeAPIAnnotation = "broker.fluidos.eu/home-api"
	// HomeTokenLabel marks the Secrets at the provider that carry a copy's
	// home token.
	HomeTokenLabel = "broker.fluidos.eu/home-api-token"
	// homeTokenRefreshAnnotation on such a Secret: when the bridge replaces
	// the token (RFC 3339), so that an agent that restarts knows.
	homeTokenRefreshAnnotation = "broker.fluidos.eu/home-api-token-refresh"

	// ServiceAccountMountPath is where the kubelet mounts a pod's token,
	// and client-go's in-cluster config reads it.
	ServiceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// rootCAConfigMap is the cluster's root CA, which kube-controller-manager
	// publishes in every namespace.
	rootCAConfigMap = "kube-root-ca.crt"

	// DefaultHomeTokenTTL and MinHomeTokenTTL bound Config.HomeTokenTTL; the
	// API server refuses a TokenRequest of less than 10 minutes.
	DefaultHomeTokenTTL = time.Hour
	MinHomeTokenTTL     = 10 * time.Minute
)

// homeTokenSecretName is the Secret, in the tenant namespace, that carries
// the home token of the copy of namespace/name: the copy's name followed by
// ".kube-api-access". A local Secret of that name (whose copy would take the
// same name) is refused by either side's origin check.
func homeTokenSecretName(namespace, name string) string {
	return RemoteName(namespace, name+".kube-api-access")
}

// homeAPIVolumes are the volumes of pod mounted at ServiceAccountMountPath
// that carry a token: the projected kube-api-access-* volume the
// ServiceAccount admission plugin adds, or the legacy token Secret's.
func homeAPIVolumes(pod *corev1.Pod) map[string]bool {
	mounted := map[string]bool{}
	mark := func(ms []corev1.VolumeMount) {
		for _, m := range ms {
			if m.MountPath == ServiceAccountMountPath || m.MountPath == ServiceAccountMountPath+"/" {
				mounted[m.Name] = true
			}
		}
	}
	for i := range pod.Spec.InitContainers {
		mark(pod.Spec.InitContainers[i].VolumeMounts)
	}
	for i := range pod.Spec.Containers {
		mark(pod.Spec.Containers[i].VolumeMounts)
	}
	out := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if mounted[v.Name] && (isServiceAccountVolume(v) || v.Secret != nil) {
			out[v.Name] = true
		}
	}
	return out
}

// serviceAccountOf is the ServiceAccount a pod runs as.
func serviceAccountOf(pod *corev1.Pod) string {
	if pod.Spec.ServiceAccountName != "" {
		return pod.Spec.ServiceAccountName
	}
	return "default"
}

// wantsHomeToken: the pod has its token's volume and did not opt out. The
// ServiceAccount admission plugin adds the volume only where the token is
// automounted (the pod's automountServiceAccountToken, else its
// ServiceAccount's, else true), so the volume says it: no read of the
// ServiceAccount on the way of every copy.
func (b *Bridge) wantsHomeToken(_ context.Context, pod *corev1.Pod) (bool, error) {
	if pod.Annotations[HomeAPIAnnotation] == "false" || len(homeAPIVolumes(pod)) == 0 {
		return false, nil
	}
	return pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken, nil
}

// homeAPIServer is this cluster's API server as the provider's pods reach it.
type homeAPIServer struct{ host, port string }

// parseHomeAPIServer reads --home-api-server (https://host[:port]).
func parseHomeAPIServer(s string) (*homeAPIServer, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("home API server %q: want https://host:port", s)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return &homeAPIServer{host: u.Hostname(), port: port}, nil
}

// homeAPIServerFor is Config.HomeAPIServer, else the address the API server
// advertises: the first ready endpoint of EndpointSlice default/kubernetes,
// read again at most once a minute.
func (b *Bridge) homeAPIServerFor(ctx context.Context) (*homeAPIServer, error) {
	if b.homeAPI != nil {
		return b.homeAPI, nil
	}
	b.advertisedMu.Lock()
	defer b.advertisedMu.Unlock()
	if b.advertised != nil && time.Since(b.advertisedAt) < time.Minute {
		return b.advertised, nil
	}
	slice, err := b.local.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		if b.advertised != nil {
			return b.advertised, nil // the last one known
		}
		return nil, fmt.Errorf("the API server's advertised address (EndpointSlice default/kubernetes; or set --home-api-server): %w", err)
	}
	s := advertisedAddress(slice)
	if s == nil {
		return nil, fmt.Errorf("EndpointSlice default/kubernetes has no ready address and port (set --home-api-server)")
	}
	b.advertised, b.advertisedAt = s, time.Now()
	return s, nil
}

func advertisedAddress(slice *discoveryv1.EndpointSlice) *homeAPIServer {
	port := ""
	for _, p := range slice.Ports {
		if p.Port != nil && (port == "" || ptr.Deref(p.Name, "") == "https") {
			port = strconv.Itoa(int(*p.Port))
		}
	}
	for _, e := range slice.Endpoints {
		if port != "" && len(e.Addresses) > 0 && ptr.Deref(e.Conditions.Ready, true) {
			return &homeAPIServer{host: e.Addresses[0], port: port}
		}
	}
	return nil
}

// env is what the kubelet injects for the kubernetes Service, pointing at
// this cluster's API server: the provider's kubelet injects its own, which a
// container's explicit variables override. The KUBERNETES_PORT_443_TCP*
// names are the ones a kubelet derives from the Service's port 443.
func (s *homeAPIServer) env() []corev1.EnvVar {
	addr := "tcp://" + net.JoinHostPort(s.host, s.port)
	return []corev1.EnvVar{
		{Name: "KUBERNETES_SERVICE_HOST", Value: s.host},
		{Name: "KUBERNETES_SERVICE_PORT", Value: s.port},
		{Name: "KUBERNETES_SERVICE_PORT_HTTPS", Value: s.port},
		{Name: "KUBERNETES_PORT", Value: addr},
		{Name: "KUBERNETES_PORT_443_TCP", Value: addr},
		{Name: "KUBERNETES_PORT_443_TCP_PROTO", Value: "tcp"},
		{Name: "KUBERNETES_PORT_443_TCP_PORT", Value: s.port},
		{Name: "KUBERNETES_PORT_443_TCP_ADDR", Value: s.host},
	}
}

// homeAPI is, in mirrorParams, the home API server and the Secret that
// carries the pod's token: the copy mounts that Secret in place of its
// token volumes and gets the API server's environment.
type homeAPI struct {
	server *homeAPIServer
	secret string
}

// applyHomeAPI replaces the token volumes of spec (homeAPIVolumes, the
// mounts stay) by the home token's Secret and, with withEnv, puts the home
// API server's variables first in each container's environment, but for
// those it sets itself (the variables after them may refer to them).
func applyHomeAPI(spec *corev1.PodSpec, volumes map[string]bool, h *homeAPI, withEnv bool) {
	for i := range spec.Volumes {
		if volumes[spec.Volumes[i].Name] {
			spec.Volumes[i].VolumeSource = corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: h.secret, DefaultMode: ptr.To(int32(0o644))}}
		}
	}
	if !withEnv {
		return
	}
	env := h.server.env()
	for i := range spec.InitContainers {
		spec.InitContainers[i].Env = prependUnset(env, spec.InitContainers[i].Env)
	}
	for i := range spec.Containers {
		spec.Containers[i].Env = prependUnset(env, spec.Containers[i].Env)
	}
	for i := range spec.EphemeralContainers {
		spec.EphemeralContainers[i].Env = prependUnset(env, spec.EphemeralContainers[i].Env)
	}
}

// homeTokens keeps the home tokens of one virtual node's copies: written
// before a copy is made (ensure), replaced at 80 % of their life (or
// Config.HomeTokenRefresh), deleted when their pod is gone or finished (the
// provider's garbage collector also deletes one with its copy, its owner).
type homeTokens struct {
	n     *providerNode
	queue workqueue.TypedDelayingInterface[types.NamespacedName] // local pods to look at, now or later

	mu sync.Mutex // one write of a pod's Secret at a time
}

func newHomeTokens(n *providerNode) *homeTokens {
	return &homeTokens{n: n, queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[types.NamespacedName]{
		Name: "home-tokens-" + n.name})}
}

// track looks at a pod again: at start-up (the tokens of the copies already
// made), and once it is gone.
func (t *homeTokens) track(pod *corev1.Pod) {
	if len(homeAPIVolumes(pod)) > 0 {
		t.queue.Add(types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name})
	}
}

// run handles the queue until ctx ends.
func (t *homeTokens) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		t.queue.ShutDown()
	}()
	for {
		key, shutdown := t.queue.Get()
		if shutdown {
			return
		}
		if err := t.sync(ctx, key); err != nil && ctx.Err() == nil {
			t.n.log.Error(err, "renewing a home API token, retrying in 10s", "pod", key.String())
			t.queue.AddAfter(key, 10*time.Second)
		}
		t.queue.Done(key)
	}
}

// sync brings the Secret of the pod key in line: deleted if the pod is gone,
// finished, or wants no token; renewed if due.
func (t *homeTokens) sync(ctx context.Context, key types.NamespacedName) error {
	rc := t.n.currentRemote()
	if rc == nil {
		t.queue.AddAfter(key, 10*time.Second)
		return nil
	}
	pod, err := t.n.localPods.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) || (err == nil && finished(pod)) {
		return t.delete(ctx, rc, key)
	}
	if err != nil {
		return err
	}
	if !admitted(pod) {
		return nil // nothing of it goes to the provider; its admission makes the copy, and the token with it
	}
	want, err := t.n.b.wantsHomeToken(ctx, pod)
	if err != nil {
		return err
	}
	if !want {
		return t.delete(ctx, rc, key)
	}
	return t.ensure(ctx, rc, pod, nil)
}

// ensure writes the home token of pod to the provider unless the one there
// is not due for renewal, owned by copy if known, and schedules its renewal.
func (t *homeTokens) ensure(ctx context.Context, rc *remoteCluster, pod, copy *corev1.Pod) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	name := homeTokenSecretName(pod.Namespace, pod.Name)
	api := rc.client.CoreV1().Secrets(rc.namespace)
	existing, err := api.Get(ctx, name, metav1.GetOptions{})
	found := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if found && !t.ours(existing, pod) {
		return errCollision{fmt.Sprintf("secret %s/%s at the provider is not the home API token of %s", rc.namespace, name, key)}
	}
	if found && existing.Annotations[OriginUIDAnnotation] == string(pod.UID) && len(existing.OwnerReferences) == 0 {
		refresh, perr := time.Parse(time.RFC3339, existing.Annotations[homeTokenRefreshAnnotation])
		if wait := time.Until(refresh); perr == nil && wait > 0 {
			t.queue.AddAfter(key, wait)
			return nil
		}
	}

	// Owned by nobody: a copy evicted and made again would take its
	// Secret with it (the provider's garbage collector) between the two;
	// the bridge deletes it once the pod is gone or finished, and the
	// tenant namespace's removal takes what an agent that was down left.
	desired, refresh, err := t.issue(ctx, pod, name)
	if err != nil {
		return err
	}
	if found {
		desired.ResourceVersion = existing.ResourceVersion
		_, err = api.Update(ctx, desired, metav1.UpdateOptions{FieldManager: FieldManager})
	} else {
		_, err = api.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
	}
	if err != nil {
		return err
	}
	t.n.log.V(1).Info("home API token written", "pod", key.String(), "secret", name, "renewal", refresh)
	t.queue.AddAfter(key, time.Until(refresh))
	return nil
}

// issue requests a token of the pod's ServiceAccount bound to the pod and
// returns the Secret that carries it and when to renew it.
func (t *homeTokens) issue(ctx context.Context, pod *corev1.Pod, name string) (*corev1.Secret, time.Time, error) {
	b := t.n.b
	objs, err := b.localObjects(ctx, pod.Namespace)
	if err != nil {
		return nil, time.Time{}, err
	}
	if !cache.WaitForCacheSync(ctx.Done(), objs.synced...) {
		return nil, time.Time{}, ctx.Err()
	}
	ca, err := objs.configMaps.Get(rootCAConfigMap)
	if err != nil {
		// Not published yet (kube-controller-manager does): transient.
		return nil, time.Time{}, fmt.Errorf("the root CA of namespace %s (ConfigMap %s): %w", pod.Namespace, rootCAConfigMap, err)
	}
	requested := time.Now()
	tr, err := b.local.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, serviceAccountOf(pod), &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(b.cfg.HomeTokenTTL / time.Second)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("a token of ServiceAccount %s/%s: %w", pod.Namespace, serviceAccountOf(pod), err)
	}
	life := tr.Status.ExpirationTimestamp.Sub(requested)
	refresh := requested.Add(life * 8 / 10)
	if r := b.cfg.HomeTokenRefresh; r > 0 && r < life {
		refresh = requested.Add(r)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{rbv1.RequesterLabel: b.cfg.ClusterID, HomeTokenLabel: "true"},
			Annotations: map[string]string{
				OriginNamespaceAnnotation:  pod.Namespace,
				OriginNameAnnotation:       pod.Name,
				OriginUIDAnnotation:        string(pod.UID),
				homeTokenRefreshAnnotation: refresh.UTC().Format(time.RFC3339),
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			"token":     []byte(tr.Status.Token),
			"ca.crt":    []byte(ca.Data["ca.crt"]),
			"namespace": []byte(pod.Namespace),
		},
	}, refresh, nil
}

// ours: existing is the home token Secret of a pod of that name.
func (t *homeTokens) ours(existing *corev1.Secret, pod *corev1.Pod) bool {
	a := existing.Annotations
	return existing.Labels[HomeTokenLabel] == "true" && a[OriginNamespaceAnnotation] == pod.Namespace && a[OriginNameAnnotation] == pod.Name
}

// delete removes the home token Secret of the pod key, if any.
func (t *homeTokens) delete(ctx context.Context, rc *remoteCluster, key types.NamespacedName) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	name := homeTokenSecretName(key.Namespace, key.Name)
	api := rc.client.CoreV1().Secrets(rc.namespace)
	existing, err := api.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if existing.Labels[HomeTokenLabel] != "true" || existing.Annotations[OriginNamespaceAnnotation] != key.Namespace ||
		existing.Annotations[OriginNameAnnotation] != key.Name {
		return nil // not ours
	}
	if err := api.Delete(ctx, name, deleteExactly(existing.UID)); client404(err) != nil && !apierrors.IsConflict(err) {
		return err
	}
	t.n.log.V(1).Info("home API token deleted", "pod", key.String(), "secret", name)
	return nil
}
