package policy

import (
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/configyaml"
)

// EnvPrefix starts the name of every environment override. The rest of the name is the field's
// dotted path, upper-cased, with dots as underscores: store.on_error is RATELIMIT_STORE_ON_ERROR.
// Every scalar field outside `policies` has one, and lists of strings take a comma-separated
// list. An empty variable counts as unset.
const EnvPrefix = "RATELIMIT_"

// envVar is one RATELIMIT_* override.
type envVar struct {
	name  string       // RATELIMIT_STORE_TIMEOUT
	path  string       // store.timeout
	index [][]int      // the field, from Config down, one struct at a time
	typ   reflect.Type // the field's type
}

// envVars lists the overrides, derived from Config's yaml tags so that a new field gets its
// variable without anyone remembering to add it. Computed once; never modified.
var envVars = func() []envVar {
	var out []envVar
	var walk func(t reflect.Type, path string, index [][]int)
	walk = func(t reflect.Type, path string, index [][]int) {
		for _, f := range configyaml.Fields(t) {
			if f.Name == "policies" {
				continue // a list of mappings: file only
			}
			p := f.Name
			if path != "" {
				p = path + "." + f.Name
			}
			idx := append(append([][]int(nil), index...), f.Index)
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft == durationType:
			case ft.Kind() == reflect.Struct:
				walk(ft, p, idx)
				continue
			case ft.Kind() == reflect.Map, ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.String:
				continue // protect.priorities and its headers: file only, like policies
			}
			out = append(out, envVar{
				name:  EnvPrefix + strings.ToUpper(strings.ReplaceAll(p, ".", "_")),
				path:  p,
				index: idx,
				typ:   ft,
			})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
}()

var durationType = reflect.TypeFor[time.Duration]()

// applyEnv sets the field of each non-empty override, creating the optional blocks on its way
// (with their defaults: RATELIMIT_IDENTITY_JWT_HS256_SECRET_ENV switches JWT on as a file's
// identity.jwt would). Only the injected getenv is read, once per load.
func applyEnv(cfg *Config, getenv func(string) string) Errors {
	var es Errors
	for _, e := range envVars {
		raw := getenv(e.name)
		if raw == "" {
			continue
		}
		val, msg := parseEnv(raw, e.typ)
		if msg != "" {
			es.add(e.name, raw, msg)
			continue
		}
		v := reflect.ValueOf(cfg).Elem()
		for _, idx := range e.index {
			v = v.FieldByIndex(idx)
			if v.Kind() == reflect.Pointer && v.Type().Elem() != durationType {
				if v.IsNil() {
					v.Set(configyaml.New(v.Type().Elem()))
				}
				v = v.Elem()
			}
		}
		v.Set(val.Convert(v.Type()))
	}
	return es
}

// parseEnv reads raw as a value of t, or says what it must be.
func parseEnv(raw string, t reflect.Type) (reflect.Value, string) {
	switch {
	case t == durationType:
		d, err := time.ParseDuration(raw)
		if err != nil {
			return reflect.Value{}, "must be a duration such as 500ms, 1m or 2h"
		}
		return reflect.ValueOf(d), ""
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return reflect.Value{}, "must be an integer"
		}
		return reflect.ValueOf(n), ""
	case t.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return reflect.Value{}, "must be a number"
		}
		return reflect.ValueOf(f), ""
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return reflect.Value{}, "must be true or false"
		}
		return reflect.ValueOf(b), ""
	case t.Kind() == reflect.Slice:
		list := []string{}
		for item := range strings.SplitSeq(raw, ",") {
			if item = strings.TrimSpace(item); item != "" {
				list = append(list, item)
			}
		}
		return reflect.ValueOf(list), ""
	}
	return reflect.ValueOf(raw), ""
}
