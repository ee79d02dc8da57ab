package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
)

// debounce is how long the file must stay quiet before it is reloaded: editors and `kubectl`
// write in several steps, and reloading each half-written state would only log noise.
const debounce = 100 * time.Millisecond

// Reloader owns the current policy set. It reads the file, compiles it beside the running set and
// swaps it in only when it is valid, so a request always sees one consistent set and a bad file
// never replaces a good one. Safe for concurrent use.
type Reloader struct {
	path string
	opts policy.LoadOptions
	comp policy.CompileOptions
	log  *zap.Logger

	current atomic.Pointer[policy.Set]

	mu       sync.Mutex // serialises reloads and guards the fields below
	lastSum  [sha256.Size]byte
	base     *policy.Config // the config the process started with: non-reloadable fields
	reloads  *prometheus.CounterVec
	lastGood prometheus.Gauge
}

// NewReloader loads and compiles path; it fails when the file is invalid, so a process never
// starts without a good set.
func NewReloader(path string, opts policy.LoadOptions, comp policy.CompileOptions, log *zap.Logger, reg prometheus.Registerer) (*Reloader, *policy.Config, error) {
	r := &Reloader{
		path: path, opts: opts, comp: comp, log: log,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_config_reloads_total",
			Help: "Configuration reload attempts by result (success, error).",
		}, []string{"result"}),
		lastGood: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last configuration load that was applied.",
		}),
	}
	for _, res := range []string{"success", "error"} {
		r.reloads.WithLabelValues(res)
	}
	if reg != nil {
		if err := errors.Join(reg.Register(r.reloads), reg.Register(r.lastGood)); err != nil {
			return nil, nil, fmt.Errorf("register reload metrics: %w", err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read config: %w", err)
	}
	cfg, set, err := r.compile(data)
	if err != nil {
		return nil, nil, err
	}
	r.base = cfg
	r.lastSum = sha256.Sum256(data)
	r.current.Store(set)
	r.lastGood.SetToCurrentTime()
	return r, cfg, nil
}

func (r *Reloader) compile(data []byte) (*policy.Config, *policy.Set, error) {
	cfg, err := policy.Parse(data, r.opts)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", r.path, err)
	}
	set, err := policy.Compile(cfg, r.comp)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", r.path, err)
	}
	return cfg, set, nil
}

// Current returns the set in force. It never returns nil.
func (r *Reloader) Current() proxy.Policies { return r.current.Load() }

// Set returns the compiled set in force.
func (r *Reloader) Set() *policy.Set { return r.current.Load() }

// Reload re-reads the file and swaps in its policies when the content changed and is valid.
// On error the running policies stay and the error is returned (and logged, and counted).
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, err := os.ReadFile(r.path)
	if err != nil {
		// A rename-over briefly removes the file; the Create that follows triggers another reload.
		r.fail(fmt.Errorf("read config: %w", err))
		return err
	}
	sum := sha256.Sum256(data)
	if sum == r.lastSum {
		return nil
	}
	cfg, set, err := r.compile(data)
	if err != nil {
		r.fail(err)
		return err
	}
	r.lastSum = sum
	r.current.Store(set)
	r.reloads.WithLabelValues("success").Inc()
	r.lastGood.SetToCurrentTime()
	r.log.Info("config reloaded", zap.String("path", r.path), zap.Int("policies", len(set.Policies())))
	for _, f := range restartOnly(r.base, cfg) {
		r.log.Warn("config field changed but needs a restart to apply; the running value stays", zap.String("field", f))
	}
	return nil
}

func (r *Reloader) fail(err error) {
	r.reloads.WithLabelValues("error").Inc()
	r.log.Error("config reload failed; keeping the running policies", zap.String("path", r.path), zap.Error(err))
}

// restartOnly lists the fields that a reload cannot apply because they shape listeners or the store.
func restartOnly(old, cur *policy.Config) []string {
	var out []string
	add := func(name string, changed bool) {
		if changed {
			out = append(out, name)
		}
	}
	add("listen", old.Listen != cur.Listen)
	add("admin_listen", old.AdminListen != cur.AdminListen)
	add("upstream", old.Upstream != cur.Upstream)
	add("upstream_timeout", old.UpstreamTimeout != cur.UpstreamTimeout)
	// DeepEqual, not Sprint: store.dynamodb is a pointer, which Sprint prints as an address.
	add("store", !reflect.DeepEqual(old.Store, cur.Store))
	add("server", old.Server != cur.Server)
	add("log", old.Log != cur.Log)
	return out
}

// Watch reloads when the file changes and whenever hup receives, until ctx ends. It watches the
// directory, not the file, so both in-place rewrites and atomic renames over the file (editors,
// Kubernetes ConfigMap symlink swaps) are seen; an unchanged file is not reloaded.
func (r *Reloader) Watch(ctx context.Context, hup <-chan os.Signal) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch config: %w", err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(r.path)); err != nil {
		return fmt.Errorf("watch config dir: %w", err)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			r.log.Info("SIGHUP: reloading config")
			_ = r.Reload() // logged and counted inside
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Chmod) && !ev.Has(fsnotify.Write) {
				continue
			}
			timer.Reset(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			r.log.Warn("config watcher error", zap.Error(err))
		case <-timer.C:
			_ = r.Reload()
		}
	}
}
