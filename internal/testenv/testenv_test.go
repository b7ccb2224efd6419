package testenv_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/fluidos-project/resource-broker/internal/testenv"
)

func TestAssetsDirDefaultsToModuleBin(t *testing.T) {
	t.Setenv(testenv.AssetsEnv, "")
	dir, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("ModuleRoot %s: %v", root, err)
	}
	if want := filepath.Join(root, "bin", "k8s"); dir != want {
		t.Errorf("AssetsDir() = %s, want %s", dir, want)
	}
}

func TestMissingBinariesSayHowToBuildThem(t *testing.T) {
	t.Setenv(testenv.AssetsEnv, t.TempDir())
	_, err := testenv.New()
	if err == nil || !strings.Contains(err.Error(), `run "make envtest-bin"`) || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Errorf("New() with an empty assets directory: %v", err)
	}
}

func TestMissingCRDDirectory(t *testing.T) {
	_, err := testenv.New(testenv.WithCRDDirectories(filepath.Join(t.TempDir(), "nope")))
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("New() with a missing CRD directory: %v", err)
	}
}

func TestStartServesCRDs(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.test.fluidos.eu"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "test.fluidos.eu",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}}},
					},
				}},
			}},
		},
	}
	cfg := testenv.Start(t, testenv.WithCRDs(crd))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "test.fluidos.eu", Version: "v1", Resource: "widgets"}
	list, err := dyn.Resource(gvr).Namespace("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing the CRD's objects: %v", err)
	}
	if len(list.Items) != 0 {
		t.Errorf("%d widgets in a fresh control plane", len(list.Items))
	}
}
