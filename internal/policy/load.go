package policy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
)

// LoadOptions are the inputs of Load and Parse besides the file itself.
type LoadOptions struct {
	// Getenv reads the RATELIMIT_* overrides. nil means os.Getenv. It is called only while
	// loading: a Set never reads the environment behind the caller's back.
	Getenv func(string) string
}

// EnvPrefix starts the name of every environment override. The rest of the name is the field's
// dotted path, upper-cased, with dots as underscores: store.on_error is RATELIMIT_STORE_ON_ERROR.
// Every scalar field outside `policies` has one, and trusted_proxies takes a comma-separated
// list. An empty variable counts as unset.
const EnvPrefix = "RATELIMIT_"

// defaultSlotLease is store.dynamodb.slot_lease's default.
const defaultSlotLease = 30 * time.Second

// Defaults of store.dynamodb.clock (correct defaults to true).
const (
	defaultMaxCorrection = 5 * time.Second
	defaultWarnOffset    = 100 * time.Millisecond
)

// defaults are the documented defaults of config.go for the fields that exist whatever the file
// says. They are viper defaults, so a field written explicitly (even as 0) keeps its value and
// is validated. identity.jwt.claim, policies[i].mode, store.dynamodb.mode and
// store.dynamodb.deny_cache are defaulted after decoding instead: a default under identity.jwt
// would switch JWT on, one under store.dynamodb would create the block.
var defaults = []struct {
	path  string
	value any
}{
	{"listen", "127.0.0.1:8080"},
	{"admin_listen", "127.0.0.1:9090"},
	{"identity.api_key_header", "X-Api-Key"},
	{"identity.ipv6_prefix", defaultIPv6Prefix},
	{"headers.reset", "unix"},
	{"store.backend", "memory"},
	{"store.on_error", "allow"},
	{"store.timeout", 50 * time.Millisecond},
	{"store.max_keys", 1000000},
	{"upstream_timeout", 60 * time.Second},
	{"grpc_upstream_timeout", time.Duration(0)},
	{"upstream_protocol", "http1"},
	{"server.read_header_timeout", 10 * time.Second},
	{"server.read_timeout", 60 * time.Second},
	{"server.grpc_idle_timeout", 5 * time.Minute},
	{"server.write_stall_timeout", 30 * time.Second},
	{"upgrade_protocols", []string{"websocket"}},
	{"server.idle_timeout", 120 * time.Second},
	{"server.drain_timeout", 30 * time.Second},
	{"server.shutdown_delay", time.Duration(0)},
	{"server.max_header_bytes", 65536},
	{"server.max_concurrent_streams", 250},
	{"log.level", "info"},
	{"log.access", false},
	{"log.pseudonym_secret_env", ""},
	{"method_override", MethodOverrideJudge},
	{"admin.top_k", 100},
	{"admin.max_exemptions", 1000},
}

const (
	defaultClaim      = "sub"
	defaultIPv6Prefix = 64
	modeEnforce       = "enforce"
	modeShadow        = "shadow"
)

// The values of store.dynamodb.mode.
const (
	dynamoModeRefund      = "refund"
	dynamoModeTransaction = "transaction"
)

// Load reads the configuration file at path; see Parse. Errors name the file.
func Load(path string, opts LoadOptions) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	cfg, err := Parse(data, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes a YAML configuration, applies the defaults and the RATELIMIT_* environment
// overrides, and returns the Config. Decoding is strict: unknown fields and values of the wrong
// type are reported together as Errors, each with its path. Parse does not validate values;
// call Validate or Compile.
//
// Keys are case-insensitive (viper folds them), so `Listen:` is `listen:`.
func Parse(data []byte, opts LoadOptions) (*Config, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	v := viper.New()
	v.SetConfigType("yaml")
	for _, d := range defaults {
		v.SetDefault(d.path, d.value)
	}
	if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
		// viper's ConfigParseError prefixes "While parsing config:"; the YAML error itself
		// carries the line.
		var pe viper.ConfigParseError
		if errors.As(err, &pe) && pe.Unwrap() != nil {
			err = pe.Unwrap()
		}
		return nil, fmt.Errorf("invalid YAML: %w", err)
	}
	var errs Errors
	applyEnv(v, getenv, &errs)

	cfg := new(Config)
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		Result:     cfg,
		DecodeHook: mapstructure.DecodeHookFuncValue(strictHook),
		TagName:    "mapstructure",
	})
	if err != nil {
		return nil, fmt.Errorf("config decoder: %w", err)
	}
	settings := v.AllSettings()
	var decodeErrs Errors
	collectDecodeErrors(dec.Decode(settings), &decodeErrs)
	// Unknown fields are found by a walk of our own: mapstructure's Metadata.Unused skips
	// every struct that also has a type error, and we report all problems at once.
	unknownFields(settings, reflect.TypeFor[Config](), "", &decodeErrs)
	// Map iteration order is random: sort for a stable report, in file order.
	slices.SortStableFunc(decodeErrs, func(a, b FieldError) int { return comparePaths(a.Path, b.Path) })
	errs = append(errs, decodeErrs...)
	if err := errs.err(); err != nil {
		return nil, err
	}

	markWritten(cfg, settings)
	if cfg.Identity.JWT != nil && cfg.Identity.JWT.Claim == "" {
		cfg.Identity.JWT.Claim = defaultClaim
	}
	for i := range cfg.Policies {
		if cfg.Policies[i].Mode == "" {
			cfg.Policies[i].Mode = modeEnforce
		}
	}
	if r := cfg.Store.Redis; r != nil {
		// Defaulted here, as store.dynamodb's are: a default would create the block.
		if r.Mode == "" {
			r.Mode = redisSingle
		}
		if r.KeyPrefix == "" {
			r.KeyPrefix = "rl:"
		}
	}
	if d := cfg.Store.DynamoDB; d != nil {
		// Defaulted here, not as viper defaults, for the same reason as the JWT claim: a
		// default under store.dynamodb would create the block for every memory-backed config.
		if d.Mode == "" {
			d.Mode = dynamoModeRefund
		}
		if !v.IsSet("store.dynamodb.deny_cache") {
			d.DenyCache = true
		}
		if !v.IsSet("store.dynamodb.slot_lease") {
			d.SlotLease = defaultSlotLease
		}
		if !v.IsSet("store.dynamodb.clock.correct") {
			d.Clock.Correct = true
		}
		if !v.IsSet("store.dynamodb.clock.max_correction") {
			d.Clock.MaxCorrection = defaultMaxCorrection
		}
		if !v.IsSet("store.dynamodb.clock.warn_offset") {
			d.Clock.WarnOffset = defaultWarnOffset
		}
	}
	defaultProtect(cfg, v) // validate_protect.go
	return cfg, nil
}

// markWritten notes which policy and override fields with a meaningful zero the file wrote, so
// that validation can tell `window: 0s` (a bad value, quoted back to the user) from a window left
// out (a missing field). settings decoded into cfg without errors, so its policies are a list of mappings
// parallel to cfg.Policies.
func markWritten(cfg *Config, settings map[string]any) {
	list, _ := settings["policies"].([]any)
	for i, item := range list {
		m, ok := item.(map[string]any)
		if !ok || i >= len(cfg.Policies) {
			continue
		}
		p := &cfg.Policies[i]
		_, p.windowSet = m["window"]
		_, p.costSet = m["cost"]
		overrides, _ := m["overrides"].([]any)
		for j, o := range overrides {
			if om, ok := o.(map[string]any); ok && j < len(p.Overrides) {
				_, p.Overrides[j].windowSet = om["window"]
			}
		}
	}
}

// envVar is one RATELIMIT_* override.
type envVar struct {
	name string       // RATELIMIT_STORE_TIMEOUT
	path string       // store.timeout
	typ  reflect.Type // the field's type
}

// envVars lists the overrides, derived from Config's fields so that a new field gets its
// variable without anyone remembering to add it. Computed once; never modified.
var envVars = func() []envVar {
	var out []envVar
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for f := range t.Fields() {
			tag := f.Tag.Get("mapstructure")
			if tag == "" || tag == "policies" {
				continue
			}
			path := prefix + tag
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				continue // a list of mappings (protect.priorities), like policies: file only
			}
			if ft.Kind() == reflect.Struct {
				walk(ft, path+".")
				continue
			}
			out = append(out, envVar{
				name: EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_")),
				path: path,
				typ:  ft,
			})
		}
	}
	walk(reflect.TypeFor[Config](), "")
	return out
}()

var durationType = reflect.TypeFor[time.Duration]()

// applyEnv sets each non-empty override on v, typed like its field so that the strict decoder
// accepts it. Only the injected getenv is read (never viper.AutomaticEnv, which would consult
// the process environment on every access and every reload).
func applyEnv(v *viper.Viper, getenv func(string) string, errs *Errors) {
	for _, e := range envVars {
		raw := getenv(e.name)
		if raw == "" {
			continue
		}
		var val any
		switch {
		case e.typ == durationType:
			d, err := time.ParseDuration(raw)
			if err != nil {
				errs.add(e.name, raw, "must be a duration such as 500ms, 1m or 2h")
				continue
			}
			val = d
		case e.typ.Kind() == reflect.Int || e.typ.Kind() == reflect.Int64:
			n, err := strconv.ParseInt(raw, 10, 64)
			if err != nil {
				errs.add(e.name, raw, "must be an integer")
				continue
			}
			val = n
		case e.typ.Kind() == reflect.Bool:
			b, err := strconv.ParseBool(raw)
			if err != nil {
				errs.add(e.name, raw, "must be true or false")
				continue
			}
			val = b
		case e.typ.Kind() == reflect.Slice:
			var list []any
			for item := range strings.SplitSeq(raw, ",") {
				if item = strings.TrimSpace(item); item != "" {
					list = append(list, item)
				}
			}
			val = list
		default:
			val = raw
		}
		if parentIsScalar(v, e.path) {
			// `store: memory` in the file: setting store.timeout would silently replace the
			// wrong value with a map; leave it for the decoder to report.
			continue
		}
		v.Set(e.path, val)
	}
}

// parentIsScalar reports whether some ancestor of path holds a non-mapping value.
func parentIsScalar(v *viper.Viper, path string) bool {
	for i := 0; i < len(path); i++ {
		if path[i] != '.' {
			continue
		}
		if p := v.Get(path[:i]); p != nil {
			if _, ok := p.(map[string]any); !ok {
				return true
			}
		}
	}
	return false
}

// unknownFields reports every key of data that no field of t (by mapstructure tag) takes,
// descending into the fields, lists and pointers that it does take.
func unknownFields(data any, t reflect.Type, path string, out *Errors) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := data.(map[string]any)
		if !ok || t == durationType {
			return
		}
		for k, val := range m {
			sub := k
			if path != "" {
				sub = path + "." + k
			}
			f, ok := fieldByTag(t, k)
			if !ok {
				out.add(sub, "", "unknown field")
				continue
			}
			unknownFields(val, f.Type, sub, out)
		}
	case reflect.Slice:
		list, ok := data.([]any)
		if !ok {
			return
		}
		for i, item := range list {
			unknownFields(item, t.Elem(), path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

// fieldByTag finds the field of struct t whose mapstructure tag is name; keys arrive
// lower-cased from viper, tags are lower case.
func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for f := range t.Fields() {
		if tag, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// typeError is a value of the wrong type in the file.
type typeError struct {
	value any    // as decoded from YAML
	want  string // "an integer"
}

func (e *typeError) Error() string { return "must be " + e.want }

// strictHook refuses the conversions that mapstructure would otherwise make silently (a float
// truncated to an integer, a list where a mapping belongs) and turns every type problem into a
// typeError that keeps the offending value for the message. Durations are parsed by
// mapstructure's StringToTimeDurationHook.
func strictHook(from, to reflect.Value) (any, error) {
	data := from.Interface()
	t := to.Type()
	switch {
	case t == durationType:
		switch d := data.(type) {
		case time.Duration:
			return d, nil
		case string:
			out, err := mapstructure.DecodeHookExec(mapstructure.StringToTimeDurationHookFunc(), from, to)
			if err != nil {
				return nil, &typeError{value: d, want: "a duration such as 500ms, 1m or 2h"}
			}
			return out, nil
		}
		return nil, &typeError{value: data, want: "a duration such as 500ms, 1m or 2h"}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		switch n := data.(type) {
		case int:
			return n, nil
		case int64:
			return n, nil
		case uint64:
			if n <= math.MaxInt64 {
				return int64(n), nil
			}
		case float64:
			if n == math.Trunc(n) && n >= math.MinInt64 && n < math.MaxInt64 {
				return int64(n), nil
			}
		}
		return nil, &typeError{value: data, want: "an integer"}
	case t.Kind() == reflect.String:
		switch s := data.(type) {
		case string:
			return s, nil
		case int, int64, uint64, float64, bool:
			// YAML authors rarely quote `rate: 50` or `name: 2024`: keep the text and let
			// validation judge it.
			return fmt.Sprint(s), nil
		}
		return nil, &typeError{value: data, want: "a string"}
	case t.Kind() == reflect.Float64:
		switch n := data.(type) {
		case float64:
			return n, nil
		case int:
			return float64(n), nil
		case int64:
			return float64(n), nil
		}
		return nil, &typeError{value: data, want: "a number"}
	case t.Kind() == reflect.Bool:
		if b, ok := data.(bool); ok {
			return b, nil
		}
		return nil, &typeError{value: data, want: "true or false"}
	case t.Kind() == reflect.Slice:
		if from.Kind() != reflect.Slice {
			return nil, &typeError{value: data, want: "a list"}
		}
	case t.Kind() == reflect.Struct || (t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct):
		if from.Kind() != reflect.Map {
			return nil, &typeError{value: data, want: "a mapping"}
		}
	}
	return data, nil
}

// collectDecodeErrors flattens mapstructure's tree of joined DecodeErrors into FieldErrors.
func collectDecodeErrors(err error, out *Errors) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			collectDecodeErrors(e, out)
		}
		return
	}
	de, ok := err.(*mapstructure.DecodeError) //nolint:errorlint // the walk unwraps one level at a time itself
	if !ok {
		// Decode wraps a joined error in "decoding failed due to ...": look inside.
		if inner := errors.Unwrap(err); inner != nil {
			collectDecodeErrors(inner, out)
			return
		}
		out.add("(config)", "", err.Error())
		return
	}
	inner := de.Unwrap()
	if _, ok := inner.(interface{ Unwrap() []error }); ok {
		collectDecodeErrors(inner, out)
		return
	}
	if _, ok := inner.(*mapstructure.DecodeError); ok { //nolint:errorlint // one level at a time, as above
		collectDecodeErrors(inner, out)
		return
	}
	var te *typeError
	var ue *mapstructure.UnconvertibleTypeError
	switch {
	case errors.As(inner, &te):
		out.add(de.Name(), scalarText(te.value), te.Error())
	case errors.As(inner, &ue):
		out.add(de.Name(), scalarText(ue.Value), "has the wrong type")
	default:
		out.add(de.Name(), "", inner.Error())
	}
}

// scalarText shows a scalar value; lists and mappings are not shown.
func scalarText(v any) string {
	switch v.(type) {
	case string, int, int64, uint64, float64, bool, time.Duration:
		return fmt.Sprint(v)
	}
	return ""
}

// comparePaths orders field paths as they appear in the file: policies[2] before policies[10].
func comparePaths(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			na, ra := leadingNumber(a)
			nb, rb := leadingNumber(b)
			if na != nb {
				if na < nb {
					return -1
				}
				return 1
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			if a[0] < b[0] {
				return -1
			}
			return 1
		}
		a, b = a[1:], b[1:]
	}
	return len(a) - len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func leadingNumber(s string) (int, string) {
	n, i := 0, 0
	for ; i < len(s) && isDigit(s[i]); i++ {
		if n < math.MaxInt32 {
			n = n*10 + int(s[i]-'0')
		}
	}
	return n, s[i:]
}
