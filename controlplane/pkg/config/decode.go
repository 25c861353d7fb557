package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decode parses the configuration file b into c. Before decoding, every
// scalar value's ${NAME} is replaced by the environment variable NAME
// (getenv); an unset or empty NAME is an error, and "$${" writes a literal
// "${". Every error names the key by its full path (host.gateway.listen)
// and the line.
func decode(b []byte, c *Config, getenv func(string) string) error {
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return &Error{Key: "file", Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if root.Kind == 0 { // an empty file
		return nil
	}
	lines := map[int]string{}
	if err := walk(&root, reflect.TypeOf(c).Elem(), "", lines, getenv); err != nil {
		return err
	}
	if err := root.Decode(c); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return keyed(te.Errors[0], lines)
		}
		return keyed(err.Error(), lines)
	}
	return nil
}

var lineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// keyed turns a decoder message "line N: ..." into an Error naming the key
// on line N.
func keyed(msg string, lines map[int]string) error {
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return &Error{Key: "file", Msg: msg}
	}
	n, _ := strconv.Atoi(m[1])
	key, ok := lines[n]
	if !ok {
		return &Error{Key: "file", Msg: msg}
	}
	return &Error{Key: key, Msg: fmt.Sprintf("line %d: %s", n, m[2])}
}

var varRE = regexp.MustCompile(`\$\$\{|\$\{([^}]*)\}`)
var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// walk checks n against the type t it decodes into: mapping keys must name
// fields (yaml tags) of t, recursively, so an unknown key is reported with
// its path. It expands ${NAME} in scalars and records each line's key.
func walk(n *yaml.Node, t reflect.Type, path string, lines map[int]string, getenv func(string) string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := walk(c, t, path, lines, getenv); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := join(path, k.Value)
			lines[k.Line] = key
			if _, set := lines[v.Line]; !set {
				lines[v.Line] = key
			}
			var vt reflect.Type
			switch t.Kind() {
			case reflect.Struct:
				f, ok := fieldByTag(t, k.Value)
				if !ok {
					return &Error{Key: key, Msg: fmt.Sprintf("line %d: unknown key %q (see docs/configuration.md)", k.Line, k.Value)}
				}
				vt = f.Type
			case reflect.Map:
				vt = t.Elem()
			default:
				// A mapping where a scalar or list belongs: the decoder
				// reports it against this line's key.
				continue
			}
			if err := walk(v, vt, key, lines, getenv); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		var et reflect.Type = t
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			et = t.Elem()
		}
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			lines[c.Line] = p
			if err := walk(c, et, p, lines, getenv); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		v, err := expand(n.Value, getenv)
		if err != nil {
			return &Error{Key: path, Msg: fmt.Sprintf("line %d: %v", n.Line, err)}
		}
		if v != n.Value {
			n.Value = v
			if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
				// A plain scalar is typed by what it now says
				// (maxStreams: ${N} is a number).
				n.Tag = ""
			}
		}
	case yaml.AliasNode:
		return &Error{Key: path, Msg: fmt.Sprintf("line %d: YAML aliases are not supported", n.Line)}
	}
	return nil
}

// expand replaces ${NAME} by getenv(NAME).
func expand(s string, getenv func(string) string) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var err error
	out := varRE.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$${" {
			return "${"
		}
		name := m[2 : len(m)-1]
		switch v := getenv(name); {
		case err != nil:
		case !nameRE.MatchString(name):
			err = fmt.Errorf("%q is not an environment variable reference: ${NAME} takes a name of letters, digits and '_' (write $${ for a literal ${)", m)
		case v == "":
			err = fmt.Errorf("${%s}: the environment variable %s is not set", name, name)
		default:
			return v
		}
		return m
	})
	return out, err
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// fieldByTag finds the field of struct t whose yaml tag (or, untagged,
// lower-cased name) is key; inline structs are searched too.
func fieldByTag(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			if sf, ok := fieldByTag(f.Type, key); ok {
				return sf, true
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if name == key && f.IsExported() {
			return f, true
		}
	}
	return reflect.StructField{}, false
}
