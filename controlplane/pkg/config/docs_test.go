package config

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDocumentedFile: the example file in docs/configuration.md decodes
// (no unknown key, no value of the wrong type, its ${BC_SECRET} from the
// environment; the files it names are not on this machine, so it is not
// validated further), and it shows every key the loader knows, so the page
// says what the code reads.
func TestDocumentedFile(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n```yaml\n")
	example, _, ok2 := strings.Cut(rest, "\n```\n")
	if !ok || !ok2 {
		t.Fatal("docs/configuration.md has no ```yaml example")
	}
	secret := strings.Repeat("d", MinSecretLen)
	var c Config
	if err := decode([]byte(example), &c, env(map[string]string{"BC_SECRET": secret})); err != nil {
		t.Fatalf("the example of docs/configuration.md: %v", err)
	}
	if c.Secret != secret {
		t.Fatalf("the example's secret: ${BC_SECRET} gave %q", c.Secret)
	}
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(example), &n); err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	var seen func(n *yaml.Node, path string)
	seen = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				seen(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := join(path, n.Content[i].Value)
				shown[p] = true
				seen(n.Content[i+1], p)
			}
		}
	}
	seen(&n, "")
	for _, key := range yamlKeys(reflect.TypeOf(Config{}), "") {
		if !shown[key] {
			t.Errorf("docs/configuration.md's example does not show %s", key)
		}
	}
}

// yamlKeys lists the key paths of t's yaml fields, list items under their
// list's key.
func yamlKeys(t reflect.Type, path string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeOf(Duration{}) {
		return nil
	}
	var keys []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		p := join(path, name)
		keys = append(keys, p)
		keys = append(keys, yamlKeys(f.Type, p)...)
	}
	slices.Sort(keys)
	return keys
}
