package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
	"github.com/fluidos-project/resource-broker/internal/kustomize"
	"github.com/fluidos-project/resource-broker/internal/rbctl/join"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// operatorBed is what an operator has after installing: the real broker on
// real Redis over mutual TLS, and the API servers of rome (which runs the
// broker, and is a member) and paris, named by contexts of one kubeconfig.
type operatorBed struct {
	broker     *brokertest.Broker
	caDir      string // the members' CA as rbctl certs keeps it
	kubeconfig string
	kube       map[string]ctrlclient.Client
	rest       map[string]*rest.Config
}

func startOperatorBed(t *testing.T, contexts ...string) *operatorBed {
	t.Helper()
	bed := &operatorBed{broker: brokertest.Start(t, brokertest.Options{}), caDir: filepath.Join(t.TempDir(), "ca"),
		kube: map[string]ctrlclient.Client{}, rest: map[string]*rest.Config{}}
	require.NoError(t, bed.broker.CA.Save(bed.caDir))
	kcfg := clientcmdapi.NewConfig()
	for _, name := range contexts {
		cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
		kcfg.Clusters[name] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
		kcfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
		kcfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
		kc, err := member.NewKubeClient(cfg)
		require.NoError(t, err)
		bed.kube[name] = kc
		bed.rest[name] = cfg
	}
	// The broker is installed in rome: its namespace is there.
	require.NoError(t, join.EnsureNamespace(context.Background(), bed.kube[contexts[0]], "resource-broker"))
	bed.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kcfg, bed.kubeconfig))
	// No kubeconfig or identity of the machine running the test leaks in.
	t.Setenv("KUBECONFIG", bed.kubeconfig)
	t.Setenv("RB_CERT_DIR", "")
	t.Setenv("RB_BROKER_URL", "")
	return bed
}

// rbctl runs rbctl against the bed's kubeconfig.
func (bed *operatorBed) rbctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runRbctl(t, append([]string{"--kubeconfig", bed.kubeconfig}, args...)...)
}

func (bed *operatorBed) memberClient(t *testing.T, ctx context.Context, context string) *client.Client {
	t.Helper()
	var s corev1.Secret
	require.NoError(t, bed.kube[context].Get(ctx, ctrlclient.ObjectKey{Namespace: "resource-broker", Name: member.SecretName}, &s))
	cert, err := tls.X509KeyPair(s.Data[certdir.CertFile], s.Data[certdir.KeyFile])
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(s.Data[certdir.CAFile]))
	c, err := client.NewWithTLS(bed.broker.URL, &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots})
	require.NoError(t, err)
	return c
}

// TestOperatorJoinAndLeave: paris joins by a request that the broker's
// operator approves in rome, rome joins in one command holding the CA, the
// broker takes each for its cluster id, and leave undoes a join once the
// member's reservations are over.
func TestOperatorJoinAndLeave(t *testing.T) {
	ctx := context.Background()
	bed := startOperatorBed(t, "rome", "paris")
	b := bed.broker

	// paris asks; its join waits for the approval.
	type result struct {
		out string
		err error
	}
	joined := make(chan result, 1)
	go func() {
		out, err := bed.rbctl(t, "join", "--context", "paris", "--cluster-id", "paris", "--broker-context", "rome",
			"--broker-url", b.URL, "--timeout", "1m")
		joined <- result{out, err}
	}()
	var csr certificatesv1.CertificateSigningRequest
	require.Eventually(t, func() bool {
		return bed.kube["rome"].Get(ctx, ctrlclient.ObjectKey{Name: "rb-member-paris"}, &csr) == nil
	}, 30*time.Second, 100*time.Millisecond, "paris's request in rome")
	assert.Equal(t, join.SignerName, csr.Spec.SignerName)
	assert.Equal(t, "paris", csr.Labels[join.ClusterIDLabel])
	req, err := certauthority.ParseCSR(csr.Spec.Request)
	require.NoError(t, err)
	assert.Equal(t, "paris", req.Subject.CommonName)

	out, err := bed.rbctl(t, "join", "approve", "paris", "--context", "rome", "--ca-dir", bed.caDir)
	require.NoError(t, err, out)
	t.Logf("rbctl join approve:\n%s", out)
	assert.Equal(t, "certificatesigningrequest/rb-member-paris approved\n"+
		"certificatesigningrequest/rb-member-paris signed by \"test CA\" for 8760h0m0s\n"+
		"configmap/rb-broker-ca created in namespace resource-broker (ca.crt: \"test CA\")\n", out)
	var res result
	select {
	case res = <-joined:
	case <-time.After(time.Minute):
		t.Fatal("rbctl join did not return after the approval")
	}
	require.NoError(t, res.err, res.out)
	t.Logf("rbctl join:\n%s", res.out)
	assertRow(t, res.out, `certificatesigningrequest/rb-member-paris created in context "rome" \(signer broker.fluidos.eu/member-client, CN=paris\)`)
	assertRow(t, res.out, `secret/rb-agent-tls written in namespace resource-broker of context "paris": tls.crt \(CN=paris, serial [0-9a-f]+, valid until \S+\), tls.key, ca.crt \(from configmap resource-broker/rb-broker-ca of context "rome"\)`)
	assertRow(t, res.out, `the broker at `+b.URL+` accepts "paris"`)

	// The Secret is what the agent mounts, and the broker takes it for paris:
	// paris may advertise paris (and no other cluster).
	var secret corev1.Secret
	require.NoError(t, bed.kube["paris"].Get(ctx, ctrlclient.ObjectKey{Namespace: "resource-broker", Name: member.SecretName}, &secret))
	assert.Equal(t, corev1.SecretTypeTLS, secret.Type)
	paris := bed.memberClient(t, ctx, "paris")
	assert.Equal(t, "paris", paris.Identity())
	_, err = paris.Advertise(ctx, "paris", api.Advertisement{Resources: api.ClusterResources{
		Capacity:    brokertest.Quantities("16", "64Gi", ""),
		Allocatable: brokertest.Quantities("16", "64Gi", ""),
	}})
	require.NoError(t, err)
	_, err = paris.Advertise(ctx, "berlin", api.Advertisement{})
	assert.True(t, client.IsForbidden(err), "paris advertising berlin: %v", err)
	require.NoError(t, bed.kube["rome"].Get(ctx, ctrlclient.ObjectKey{Name: "rb-member-paris"}, &csr))
	assert.True(t, join.IsApproved(&csr))

	out, err = bed.rbctl(t, "join", "--context", "paris", "--cluster-id", "paris", "--broker-context", "rome")
	assert.ErrorContains(t, err, `context "paris" already has Secret resource-broker/rb-agent-tls (cluster id "paris"): rbctl leave first, or --overwrite for a new key`, out)

	// rome joins in one command: its operator holds the CA.
	out, err = bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "rome", "--broker-context", "rome",
		"--ca-dir", bed.caDir, "--broker-url", b.URL)
	require.NoError(t, err, out)
	t.Logf("rbctl join --ca-dir:\n%s", out)
	assert.Contains(t, out, "certificatesigningrequest/rb-member-rome approved\n")
	assertRow(t, out, `the broker at `+b.URL+` accepts "rome"`)

	// rome borrows from paris: paris may not leave while it provides.
	r, err := bed.memberClient(t, ctx, "rome").Reserve(ctx, api.ReservationRequest{ID: "r1", Resources: brokertest.Quantities("2", "4Gi", "")})
	require.NoError(t, err)
	require.Equal(t, "paris", r.Provider)
	out, err = bed.rbctl(t, "leave", "--context", "paris", "--broker-context", "rome", "--broker-url", b.URL)
	assert.ErrorContains(t, err, `"paris" still has 1 live reservations (as provider: r1): end them first, or --force`, out)
	require.NoError(t, bed.kube["paris"].Get(ctx, ctrlclient.ObjectKey{Namespace: "resource-broker", Name: member.SecretName}, &secret), "still a member")

	_, err = bed.memberClient(t, ctx, "rome").Release(ctx, "r1")
	require.NoError(t, err)
	out, err = bed.rbctl(t, "leave", "--context", "paris", "--broker-context", "rome", "--broker-url", b.URL)
	require.NoError(t, err, out)
	t.Logf("rbctl leave:\n%s", out)
	assertRow(t, out, `secret/rb-agent-tls deleted from namespace resource-broker of context "paris" \(cluster id "paris"\)`)
	assertRow(t, out, `certificatesigningrequest/rb-member-paris deleted from context "rome"`)
	assertRow(t, out, `the broker forgot "paris": its advertisement, nodes and index entries are gone`)
	assertRow(t, out, `the certificate \(serial [0-9a-f]+\) stays valid until \S+: there is no revocation`)
	_, err = b.Store.Cluster(ctx, "paris")
	assert.ErrorIs(t, err, store.ErrNotFound, "the broker forgot paris")
	require.NoError(t, b.Store.CheckInvariant(ctx))
	err = bed.kube["paris"].Get(ctx, ctrlclient.ObjectKey{Namespace: "resource-broker", Name: member.SecretName}, &secret)
	assert.True(t, apierrors.IsNotFound(err), "the Secret is gone: %v", err)
	err = bed.kube["rome"].Get(ctx, ctrlclient.ObjectKey{Name: "rb-member-paris"}, &csr)
	assert.True(t, apierrors.IsNotFound(err), "the request is gone: %v", err)

	_, err = bed.rbctl(t, "get", "clusters", "--context", "paris", "--broker-url", b.URL)
	assert.ErrorContains(t, err, `context "paris" has no Secret resource-broker/rb-agent-tls: is it a member? (rbctl join makes one; or pass --cert-dir)`)
	_, err = bed.rbctl(t, "leave", "--context", "paris")
	assert.ErrorContains(t, err, "not a member (nothing to undo)")

	// paris joins again (a new key), now in one command.
	out, err = bed.rbctl(t, "join", "--context", "paris", "--cluster-id", "paris", "--broker-context", "rome", "--ca-dir", bed.caDir)
	require.NoError(t, err, out)
	assert.Contains(t, out, "not checked with the broker (no --broker-url)")
	assert.Equal(t, "paris", bed.memberClient(t, ctx, "paris").Identity())
}

// TestOperatorJoinRefusesBadRequests: the approver signs only a client
// certificate that names the member it approves.
func TestOperatorJoinRefusesBadRequests(t *testing.T) {
	ctx := context.Background()
	bed := startOperatorBed(t, "rome")
	kc := bed.kube["rome"]

	// A request under mallory's name that asks for paris's identity.
	csrPEM, _, err := certauthority.NewClientCSR("paris")
	require.NoError(t, err)
	require.NoError(t, kc.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "rb-member-mallory"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM, SignerName: join.SignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageClientAuth}},
	}))
	_, err = bed.rbctl(t, "join", "approve", "mallory", "--context", "rome", "--ca-dir", bed.caDir)
	assert.ErrorContains(t, err, `CertificateSigningRequest rb-member-mallory asks for CN="paris", not the member "mallory"`)
	var csr certificatesv1.CertificateSigningRequest
	require.NoError(t, kc.Get(ctx, ctrlclient.ObjectKey{Name: "rb-member-mallory"}, &csr))
	assert.False(t, join.IsApproved(&csr), "not approved")
	assert.Empty(t, csr.Status.Certificate, "not signed")

	// A server certificate is not a member's.
	csrPEM, _, err = certauthority.NewClientCSR("oslo")
	require.NoError(t, err)
	require.NoError(t, kc.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "rb-member-oslo"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM, SignerName: join.SignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageServerAuth}},
	}))
	_, err = bed.rbctl(t, "join", "approve", "oslo", "--context", "rome", "--ca-dir", bed.caDir)
	assert.ErrorContains(t, err, `CertificateSigningRequest rb-member-oslo asks for usage "server auth": a member certificate is for client authentication only`)

	_, err = bed.rbctl(t, "join", "approve", "nobody", "--context", "rome", "--ca-dir", bed.caDir)
	assert.ErrorContains(t, err, "no CertificateSigningRequest rb-member-nobody: has rbctl join --cluster-id nobody been run against this cluster?")
	_, err = bed.rbctl(t, "join", "approve", "paris", "--context", "rome")
	assert.ErrorContains(t, err, "--ca-dir is required")
	_, err = bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "Paris_1", "--broker-context", "rome")
	assert.ErrorContains(t, err, `--cluster-id: invalid cluster id "Paris_1"`)
	_, err = bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "paris")
	assert.ErrorContains(t, err, "--broker-context is required")
	_, err = bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "paris", "--broker-context", "hub")
	assert.ErrorContains(t, err, `--broker-context: kubeconfig has no context "hub"`)
	// Approved and signed by other hands than rbctl's (kubectl certificate
	// approve and a signer of the operator's): join has a certificate, but
	// nothing says which CA to trust for the broker until it is told.
	signByHand := func(c *certificatesv1.CertificateSigningRequest) error {
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ByHand"})
		if err := kc.SubResource("approval").Update(ctx, c); err != nil {
			return err
		}
		cert, err := bed.broker.CA.SignClientCSR(c.Spec.Request, time.Hour)
		if err != nil {
			return err
		}
		c.Status.Certificate = cert
		return kc.Status().Update(ctx, c)
	}
	onRequest(t, kc, "rb-member-rome", signByHand)
	_, err = bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "rome", "--broker-context", "rome", "--timeout", "1m")
	assert.ErrorContains(t, err, `no ConfigMap resource-broker/rb-broker-ca in context "rome" for the broker's CA (rbctl join approve publishes it; or pass --broker-ca-file)`)
	onRequest(t, kc, "rb-member-rome", signByHand)
	caFile := filepath.Join(bed.caDir, certauthority.CACertFile)
	out, err := bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "rome", "--broker-context", "rome", "--timeout", "1m",
		"--broker-ca-file", caFile)
	require.NoError(t, err, out)
	assertRow(t, out, `secret/rb-agent-tls written in namespace resource-broker of context "rome": tls.crt \(CN=rome, serial [0-9a-f]+, valid until \S+\), tls.key, ca.crt \(`+caFile+`\)`)

	// A request denied with kubectl certificate deny ends join's wait.
	onRequest(t, kc, "rb-member-rome", func(c *certificatesv1.CertificateSigningRequest) error {
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "NotOurs", Message: "who are you?"})
		return kc.SubResource("approval").Update(ctx, c)
	})
	_, err = bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "rome", "--broker-context", "rome", "--timeout", "1m", "--overwrite")
	assert.ErrorContains(t, err, "CertificateSigningRequest rb-member-rome Denied: NotOurs who are you?")
}

// onRequest applies decide, in the background, to the next request name
// that has no decision yet (as another approver would).
func onRequest(t *testing.T, kc ctrlclient.Client, name string, decide func(*certificatesv1.CertificateSigningRequest) error) {
	var c certificatesv1.CertificateSigningRequest
	err := kc.Get(context.Background(), ctrlclient.ObjectKey{Name: name}, &c)
	seen := c.UID // a decided request of an earlier join is not the next one
	if err != nil {
		seen = ""
	}
	go func() {
		assert.Eventually(t, func() bool {
			var c certificatesv1.CertificateSigningRequest
			if kc.Get(context.Background(), ctrlclient.ObjectKey{Name: name}, &c) != nil || c.UID == seen || len(c.Status.Conditions) > 0 {
				return false
			}
			return decide(&c) == nil
		}, 30*time.Second, 50*time.Millisecond, "deciding %s", name)
	}()
}

// TestOperatorNameResolution: with a kubeconfig, rbctl acts as the member of
// --context (its Secret, its agent's broker URL) and names reservations by
// their Reservation objects; without one it says what to pass.
func TestOperatorNameResolution(t *testing.T) {
	ctx := context.Background()
	bed := startOperatorBed(t, "rome")
	b := bed.broker
	kc := bed.kube["rome"]
	require.NoError(t, join.EnsureNamespace(ctx, kc, "resource-broker"))
	pair, err := b.CA.IssueClient("rome")
	require.NoError(t, err)
	require.NoError(t, kc.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "resource-broker", Name: member.SecretName},
		Data: brokertest.TLSFiles(pair, b.CA.CertPEM)}))
	// The agent as manifests/agent deploys it: BROKER_URL in a generated ConfigMap.
	require.NoError(t, kc.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "resource-broker", Name: "rb-agent-config-7h2k9"},
		Data: map[string]string{"CLUSTER_ID": "rome", "BROKER_URL": b.URL}}))
	labels := map[string]string{"app": "rb-agent"}
	require.NoError(t, kc.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "resource-broker", Name: member.AgentDeployment},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "rb-agent", Image: "rb-agent",
				EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "rb-agent-config-7h2k9"}}}}}}},
		}},
	}))

	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	b.Advertise("berlin", "16", "64Gi", "", "0.05", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations",
		api.ReservationRequest{ID: "0b6f7a52-uid", Resources: brokertest.Quantities("2", "4Gi", "")})
	require.Equal(t, http.StatusCreated, code, "%s", data)
	br := brokertest.Decode[api.Reservation](t, data)

	// The Reservation object the agent keeps for it, with its status and an event.
	require.NoError(t, join.EnsureNamespace(ctx, kc, "demo"))
	obj := &v1alpha1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "big-x7k2p"},
		Spec: v1alpha1.ReservationSpec{PodName: "big", Resources: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}}}
	require.NoError(t, kc.Create(ctx, obj))
	obj.Status = v1alpha1.ReservationStatus{Phase: v1alpha1.ReservationActive, ReservationID: br.ID, Provider: "paris", VirtualNode: "rb-paris"}
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Granted", Message: "paris granted access"})
	require.NoError(t, kc.Status().Update(ctx, obj))
	// A second object whose broker reservation has ended, in another namespace.
	require.NoError(t, join.EnsureNamespace(ctx, kc, "batch"))
	old := &v1alpha1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: "batch", Name: "job-1"},
		Spec: v1alpha1.ReservationSpec{Resources: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
	require.NoError(t, kc.Create(ctx, old))
	old.Status = v1alpha1.ReservationStatus{Phase: v1alpha1.ReservationReleased, ReservationID: "gone-uid", Provider: "berlin"}
	require.NoError(t, kc.Status().Update(ctx, old))
	require.NoError(t, kc.Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "big-x7k2p.1"},
		EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "broker.fluidos.eu/rb-agent", ReportingInstance: "rb-agent-0",
		Action: "Reserve", Reason: "Reserved", Type: corev1.EventTypeNormal, Note: "paris reserved 2 CPU, 4Gi",
		Regarding: corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Reservation", Namespace: "demo", Name: obj.Name, UID: obj.UID},
	}))

	// The broker's URL from the agent, the identity from the Secret.
	out, err := bed.rbctl(t, "get", "clusters", "--context", "rome")
	require.NoError(t, err, out)
	assertRow(t, out, `paris +yes +14/16 +60Gi/64Gi +- +0\.03 EUR +\d+s`)

	out, err = bed.rbctl(t, "get", "reservations", "--context", "rome", "-n", "demo")
	require.NoError(t, err, out)
	t.Logf("\n%s", out)
	assertRow(t, out, `NAME +PHASE +REQUESTER +PROVIDER +CPU +MEMORY +SCORE +REMAINING`)
	assertRow(t, out, `big-x7k2p +Reserved +rome +paris +2 +4Gi +\d+\.\d\d +(59|60)m`)
	assert.NotContains(t, out, "job-1", "another namespace")

	out, err = bed.rbctl(t, "get", "reservations", "--context", "rome", "-A", "-o", "wide", "--no-headers")
	require.NoError(t, err, out)
	t.Logf("\n%s", out)
	assertRow(t, out, `batch +job-1 +Released +rome +berlin +1 +1Gi +- +- +gone-uid +- +- +- +- +-`)
	assertRow(t, out, `demo +big-x7k2p +Reserved +rome +paris +2 +4Gi +\d+\.\d\d +(59|60)m +0b6f7a52-uid +- +[0-9.]+ +rb-paris +- +-`)
	out, err = bed.rbctl(t, "get", "reservations", "--context", "rome", "-A", "-o", "name")
	require.NoError(t, err, out)
	assert.Equal(t, "reservation/job-1\nreservation/big-x7k2p\n", out)

	out, err = bed.rbctl(t, "get", "reservation", "big-x7k2p", "--context", "rome", "-n", "demo", "-o", "jsonpath={.provider} {.id}")
	require.NoError(t, err, out)
	assert.Equal(t, "paris 0b6f7a52-uid", out)
	out, err = bed.rbctl(t, "get", "reservation", "big-x7k2p", "--context", "rome", "-n", "demo", "-o", "json")
	require.NoError(t, err, out)
	assert.Equal(t, br.Candidates, brokertest.Decode[api.Reservation](t, []byte(out)).Candidates)

	out, err = bed.rbctl(t, "describe", "reservation", "big-x7k2p", "--context", "rome", "-n", "demo")
	require.NoError(t, err, out)
	t.Logf("\n%s", out)
	assertRow(t, out, `Name: +big-x7k2p`)
	assertRow(t, out, `Virtual Node: +rb-paris`)
	assertRow(t, out, `Reservation: +0b6f7a52-uid`)
	assertRow(t, out, `Provider: +paris`)
	assert.Contains(t, out, "paris has the highest score of the 2 best candidates")
	assertRow(t, out, `  Ready +True +Granted +\d+s +paris granted access`)
	assertRow(t, out, `  Normal +Reserved +\d+s +broker.fluidos.eu/rb-agent +paris reserved 2 CPU, 4Gi`)
	out, err = bed.rbctl(t, "describe", "reservation", "job-1", "--context", "rome", "-n", "batch")
	require.NoError(t, err, out)
	assertRow(t, out, `Decision: the broker has no record of it \(id "gone-uid"\)`)

	// The current context and its namespace, as kubectl.
	_, err = bed.rbctl(t, "get", "reservations")
	require.ErrorContains(t, err, "no member cluster to act as", "no current context: none is picked")
	kcfg, err := clientcmd.LoadFromFile(bed.kubeconfig)
	require.NoError(t, err)
	kcfg.CurrentContext = "rome"
	kcfg.Contexts["rome"].Namespace = "demo"
	require.NoError(t, clientcmd.WriteToFile(*kcfg, bed.kubeconfig))
	out, err = bed.rbctl(t, "get", "reservations", "-o", "name")
	require.NoError(t, err, out)
	assert.Equal(t, "reservation/big-x7k2p\n", out, "the current context and its namespace")
	out, err = bed.rbctl(t, "get", "reservation", "big-x7k2p", "--context", "rome", "-n", "default", "-o", "name")
	assert.ErrorContains(t, err, `reservation "big-x7k2p" not found in namespace "default" of context "rome"`, out)

	// A Secret made by hand before rbctl join (Opaque, install.md of old):
	// --overwrite renews its key and certificate and keeps its type.
	var before corev1.Secret
	require.NoError(t, kc.Get(ctx, ctrlclient.ObjectKey{Namespace: "resource-broker", Name: member.SecretName}, &before))
	out, err = bed.rbctl(t, "join", "--context", "rome", "--cluster-id", "rome", "--broker-context", "rome", "--ca-dir", bed.caDir, "--overwrite")
	require.NoError(t, err, out)
	var after corev1.Secret
	require.NoError(t, kc.Get(ctx, ctrlclient.ObjectKey{Namespace: "resource-broker", Name: member.SecretName}, &after))
	assert.Equal(t, corev1.SecretTypeOpaque, after.Type)
	assert.NotEqual(t, before.Data[certdir.KeyFile], after.Data[certdir.KeyFile], "a new key")
	out, err = bed.rbctl(t, "get", "clusters", "paris", "--context", "rome", "-o", "name")
	require.NoError(t, err, out)
	assert.Equal(t, "cluster/paris\n", out)

	// --cert-dir and --broker-url still name an identity by hand; names are
	// then the broker's ids.
	out, err = runRbctl(t, brokerArgs(b, "rome", "get", "reservation", br.ID, "-o", "name")...)
	require.NoError(t, err, out)
	assert.Equal(t, "reservation/0b6f7a52-uid\n", out)

	// Nothing to act as: say what to pass, never pick a cluster.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	_, err = runRbctl(t, "get", "clusters")
	assert.ErrorContains(t, err, "no member cluster to act as: pass --context <a member's kubeconfig context> "+
		"(rbctl reads its Secret resource-broker/rb-agent-tls), or --cert-dir <directory with tls.crt, tls.key, ca.crt> and --broker-url")
	_, err = runRbctl(t, "get", "clusters", "--cert-dir", b.ClusterCertDir("rome"))
	assert.ErrorContains(t, err, "--cert-dir needs --broker-url (or RB_BROKER_URL)")
	_, err = runRbctl(t, "get")
	assert.ErrorContains(t, err, "say what to get: rbctl get clusters or rbctl get reservations")
}

// TestOperatorJoinWithLeastPrivilege: manifests/broker/join's roles are
// enough, and no more than enough, for a member's operator (alice) and the
// broker's (bob) to join paris in two steps and for paris to leave.
func TestOperatorJoinWithLeastPrivilege(t *testing.T) {
	ctx := context.Background()
	bed := startOperatorBed(t, "rome", "paris")
	objs, err := kustomize.Build(testenv.ModulePath(t, "manifests", "broker", "join"))
	require.NoError(t, err)
	require.NoError(t, kustomize.Apply(ctx, bed.rest["rome"], "rbctl-test", objs))
	kc := bed.kube["rome"]
	bind := func(user, role string) {
		subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
		require.NoError(t, kc.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role + "-" + user},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}, Subjects: subjects}))
		require.NoError(t, kc.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "resource-broker", Name: role + "-" + user},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role}, Subjects: subjects}))
	}
	bind("alice", "rb-member-join")
	bind("bob", "rb-member-approve")
	// Contexts of rome as alice and as bob (the admin impersonates them).
	kcfg, err := clientcmd.LoadFromFile(bed.kubeconfig)
	require.NoError(t, err)
	for _, user := range []string{"alice", "bob"} {
		auth := *kcfg.AuthInfos["rome"]
		auth.Impersonate = user
		kcfg.AuthInfos["rome-"+user] = &auth
		kcfg.Contexts["rome-"+user] = &clientcmdapi.Context{Cluster: "rome", AuthInfo: "rome-" + user}
	}
	require.NoError(t, clientcmd.WriteToFile(*kcfg, bed.kubeconfig))

	// alice may ask, not approve.
	csrPEM, _, err := certauthority.NewClientCSR("oslo")
	require.NoError(t, err)
	require.NoError(t, kc.Create(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "rb-member-oslo"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM, SignerName: join.SignerName, Usages: []certificatesv1.KeyUsage{certificatesv1.UsageClientAuth}}}))
	_, err = bed.rbctl(t, "join", "approve", "oslo", "--context", "rome-alice", "--ca-dir", bed.caDir)
	assert.ErrorContains(t, err, `approving CertificateSigningRequest rb-member-oslo: certificatesigningrequests.certificates.k8s.io "rb-member-oslo" is forbidden: User "alice" cannot update resource "certificatesigningrequests/approval"`)

	joined := make(chan error, 1)
	go func() {
		out, err := bed.rbctl(t, "join", "--context", "paris", "--cluster-id", "paris", "--broker-context", "rome-alice",
			"--broker-url", bed.broker.URL, "--timeout", "1m")
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, out)
		}
		joined <- err
	}()
	require.Eventually(t, func() bool {
		return kc.Get(ctx, ctrlclient.ObjectKey{Name: "rb-member-paris"}, &certificatesv1.CertificateSigningRequest{}) == nil
	}, 30*time.Second, 100*time.Millisecond)
	out, err := bed.rbctl(t, "join", "approve", "paris", "--context", "rome-bob", "--ca-dir", bed.caDir)
	require.NoError(t, err, out)
	select {
	case err := <-joined:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("rbctl join did not return after the approval")
	}
	assert.Equal(t, "paris", bed.memberClient(t, ctx, "paris").Identity())
	// bob's second approval finds the ConfigMap there: get and update by name.
	out, err = bed.rbctl(t, "join", "approve", "paris", "--context", "rome-bob", "--ca-dir", bed.caDir)
	require.NoError(t, err, out)
	assert.Equal(t, "certificatesigningrequest/rb-member-paris already signed\n", out)

	out, err = bed.rbctl(t, "leave", "--context", "paris", "--broker-context", "rome-alice", "--broker-url", bed.broker.URL)
	require.NoError(t, err, out)
	assertRow(t, out, `certificatesigningrequest/rb-member-paris deleted from context "rome-alice"`)
}
