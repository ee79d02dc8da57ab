package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
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

	mu sync.Mutex // serialises reloads and guards the fields below
	// inputs are the files the running set was compiled from, with their digests: the config
	// file and every file it references. A watcher event that changes none of them is ignored.
	inputs []input
	// refs are the files referenced by the last config that parsed, valid or not: the watcher
	// watches their directories, so a key file that appears after a failed reload is seen.
	refs     []input
	base     *policy.Config // the config the process started with: non-reloadable fields
	reloads  *prometheus.CounterVec
	lastGood prometheus.Gauge
	onSet    func(*policy.Set) // told every set applied (see OnSet)
}

// OnSet calls f with the running set now and with every set a reload applies from then on.
func (r *Reloader) OnSet(f func(*policy.Set)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onSet = f
	f(r.current.Load())
}

// input is one file a compiled set depends on.
type input struct {
	field string // the config field that names the file; "" for the config file itself
	path  string // as written in the config: policy resolves it against the working directory
	sum   [sha256.Size]byte
	ok    bool // the file was readable; an unreadable file never compares equal
	// folder marks a folder input (rls.config_dir): sum digests the names and contents of the
	// configuration files in it, and every entry of it matters to the watcher.
	folder bool
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
	cfg, inputs, err := r.read()
	if err != nil {
		return nil, nil, err
	}
	set, err := r.compile(cfg)
	if err != nil {
		return nil, nil, err
	}
	r.base = cfg
	r.inputs = inputs
	r.refs = inputs[1:]
	r.current.Store(set)
	r.lastGood.SetToCurrentTime()
	return r, cfg, nil
}

// read reads and parses the config file and reads the files it references; inputs[0] is the
// config file.
func (r *Reloader) read() (*policy.Config, []input, error) {
	data, err := os.ReadFile(r.path)
	if err != nil {
		// A rename-over briefly removes the file; the Create that follows triggers another reload.
		return nil, nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := policy.ParseFile(r.path, data, r.opts)
	if err != nil {
		if fe := (policy.Errors{}); errors.As(err, &fe) {
			// Every problem of the file, validation's too, as `validate` reports them.
			if _, _, all := policy.CheckData(r.path, data, r.opts, r.comp); all != nil {
				err = all
			}
		}
		return nil, nil, namePath(r.path, err)
	}
	// The referenced files are hashed before Compile reads them: if one changes in between, the
	// set holds the newer content under the older digest, and the event of that change (which
	// comes after) reloads again. Hashing after Compile could record a digest newer than the
	// compiled content, and the next event would wrongly find nothing changed.
	inputs := append([]input{{path: r.path, sum: sha256.Sum256(data), ok: true}}, referencedFiles(cfg)...)
	return cfg, inputs, nil
}

// compile validates cfg, which reads the referenced files again: an unreadable or invalid one is
// reported with its field and path, like any bad field.
func (r *Reloader) compile(cfg *policy.Config) (*policy.Set, error) {
	set, err := policy.Compile(cfg, r.comp)
	if err != nil {
		return nil, namePath(r.path, err)
	}
	return set, nil
}

// namePath names the config file in err, unless its problems already do (each at its line).
func namePath(path string, err error) error {
	if fe := (policy.Errors{}); errors.As(err, &fe) {
		return err
	}
	return fmt.Errorf("%s: %w", path, err)
}

// referencedFiles reads every file that cfg names and that Compile reads. Paths stay as written:
// policy opens them relative to the working directory, and so does this.
func referencedFiles(cfg *policy.Config) []input {
	var out []input
	add := func(field, path string) {
		if path == "" {
			return
		}
		in := input{field: field, path: path}
		if data, err := os.ReadFile(path); err == nil {
			in.sum, in.ok = sha256.Sum256(data), true
		}
		out = append(out, in)
	}
	if j := cfg.Identity.JWT; j != nil {
		add("identity.jwt.rs256_public_key_file", j.RS256PublicKeyFile)
	}
	if t := cfg.TLS; t != nil {
		add("tls.cert_file", t.CertFile)
		add("tls.key_file", t.KeyFile)
		add("tls.client_ca_file", t.ClientCAFile)
	}
	if r := cfg.RLS; r != nil && r.ConfigDir != "" {
		out = append(out, folderInput("rls.config_dir", r.ConfigDir))
	}
	return out
}

// folderInput digests the configuration files of dir as policy reads them (names and
// contents), so that adding, removing or editing one is a change and anything else is not.
func folderInput(field, dir string) input {
	in := input{field: field, path: dir, folder: true}
	names, err := envoyrules.Files(dir)
	if err != nil {
		return in
	}
	h := sha256.New()
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			return in
		}
		sum := sha256.Sum256(data)
		h.Write([]byte(name))
		h.Write([]byte{0})
		h.Write(sum[:])
	}
	h.Sum(in.sum[:0])
	in.ok = true
	return in
}

// changedInputs names the inputs of cur that differ from old (a field, or "config" for the file
// itself); a file that is no longer referenced is not named, the config's change already is.
func changedInputs(old, cur []input) []string {
	var out []string
	for _, c := range cur {
		i := slices.IndexFunc(old, func(o input) bool { return o.field == c.field && o.path == c.path })
		if i >= 0 && old[i].ok && c.ok && old[i].sum == c.sum {
			continue
		}
		name := c.field
		if name == "" {
			name = "config"
		}
		out = append(out, name)
	}
	return out
}

// Current returns the set in force. It never returns nil.
func (r *Reloader) Current() proxy.Policies { return r.current.Load() }

// Set returns the compiled set in force.
func (r *Reloader) Set() *policy.Set { return r.current.Load() }

// Reload re-reads the config file and the files it references (the JWT public key) and swaps in
// their policies when they are valid, even when nothing changed: it is what SIGHUP does, and an
// operator who sends SIGHUP expects a recompile. A reload of unchanged inputs builds the same
// bucket keys, so no count is lost; it is counted as a success and logged as changing nothing.
// On error the running policies stay and the error is returned (and logged, and counted).
func (r *Reloader) Reload() error { return r.reload(true) }

// reload is Reload; without force, inputs identical to the running set's are not recompiled
// (nothing logged or counted), which is what a watcher event that changed nothing deserves.
func (r *Reloader) reload(force bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg, inputs, err := r.read()
	if err != nil {
		r.fail(err)
		return err
	}
	// Followed even when the config turns out invalid: the key file it names may be on its way.
	r.refs = inputs[1:]
	changed := changedInputs(r.inputs, inputs)
	if len(changed) == 0 && !force {
		r.log.Debug("config and referenced files unchanged; not reloaded", zap.String("path", r.path))
		return nil
	}
	set, err := r.compile(cfg)
	if err != nil {
		r.fail(err)
		return err
	}
	r.inputs = inputs
	r.current.Store(set)
	if r.onSet != nil {
		r.onSet(set)
	}
	r.reloads.WithLabelValues("success").Inc()
	r.lastGood.SetToCurrentTime()
	msg := "config reloaded"
	if len(changed) == 0 {
		msg = "config reloaded; nothing changed since the last reload"
	}
	r.log.Info(msg, zap.String("path", r.path), zap.Strings("changed", changed), zap.Int("policies", len(set.Policies())))
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
	add("admin.hosts", !slices.Equal(old.Admin.Hosts, cur.Admin.Hosts))
	add("upstream", old.Upstream != cur.Upstream)
	add("upstream_timeout", old.UpstreamTimeout != cur.UpstreamTimeout)
	add("grpc_upstream_timeout", old.GRPCUpstreamTimeout != cur.GRPCUpstreamTimeout)
	add("upstream_protocol", old.UpstreamProtocol != cur.UpstreamProtocol)
	add("upgrade_protocols", !slices.Equal(old.UpgradeProtocols, cur.UpgradeProtocols))
	add("grpc_routes", !slices.Equal(old.GRPCRoutes, cur.GRPCRoutes))
	// DeepEqual, not Sprint: store.dynamodb is a pointer, which Sprint prints as an address.
	add("store", !reflect.DeepEqual(old.Store, cur.Store))
	add("server", old.Server != cur.Server)
	add("log", old.Log != cur.Log)
	// The files of the tls block reload; switching TLS on or off changes the listener.
	add("tls", (old.TLS == nil) != (cur.TLS == nil))
	// rls.config_dir and its files reload; the service's port and answer shape do not.
	add("rls", rlsRestartFields(old.RLS) != rlsRestartFields(cur.RLS))
	// An adaptive limit learns the upstream: a reload must not start it over.
	add("protect", !reflect.DeepEqual(old.Protect, cur.Protect))
	// The exporters are built once (telemetry.go); trusted_proxies, which decides whose trace
	// context is believed, reloads.
	add("telemetry", !reflect.DeepEqual(old.Telemetry, cur.Telemetry))
	return out
}

// rlsRestartFields are the rls fields a reload cannot apply; the zero value without an rls block.
func rlsRestartFields(r *policy.RLSConfig) policy.RLSConfig {
	if r == nil {
		return policy.RLSConfig{}
	}
	return policy.RLSConfig{Listen: r.Listen, ResponseHeaders: r.ResponseHeaders, ShadowMode: r.ShadowMode}
}

// watchSet is what the watcher reacts to: the config file and the files the last parsed config
// references (valid or not: a key file may be on its way), each in its directory. Relative
// paths resolve against the working directory, as policy resolves them, so that `key.pem` and
// `./key.pem` are one watch.
func (r *Reloader) watchSet() *watchSet {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := newWatchSet()
	s.addFile(r.path)
	for _, in := range r.refs {
		if in.folder {
			s.addFolder(in.path)
			continue
		}
		s.addFile(in.path)
	}
	return s
}

// watchDirs are the directories the watcher watches: those of watchSet.
func (r *Reloader) watchDirs() []string { return r.watchSet().dirs }

// syncWatches makes w watch exactly the directories of the current watchSet, and returns the
// set. It compares with w's own list, not a copy, because fsnotify drops the watch of a
// directory that is deleted or moved away; the next sync adds it back once the directory exists
// again. A directory that cannot be watched is logged and skipped: SIGHUP still reloads.
func (r *Reloader) syncWatches(w *fsnotify.Watcher) *watchSet {
	set := r.watchSet()
	for _, d := range w.WatchList() {
		if !slices.Contains(set.dirs, d) {
			_ = w.Remove(d) // already gone when fsnotify dropped it
		}
	}
	have := w.WatchList()
	for _, d := range set.dirs {
		if slices.Contains(have, d) {
			continue
		}
		if err := w.Add(d); err != nil {
			r.log.Warn("cannot watch a directory of the config or of a file it references; SIGHUP reloads it",
				zap.String("dir", d), zap.Error(err))
		}
	}
	return set
}

// Watcher is a started watch of the config file and the files it references: StartWatch
// returns it once they are watched, so that no change after that is missed. Run serves it.
type Watcher struct {
	r   *Reloader
	w   *fsnotify.Watcher
	set *watchSet // what the events must be about; rebuilt with each sync
}

// StartWatch watches the directories of the config file and of the files it references (the JWT
// public key, the TLS files), not the files, so in-place rewrites, atomic renames over a file
// (editors) and Kubernetes ConfigMap and Secret updates (a symlink swap of `..data` in the
// mounted directory) are all seen; events about other files in those directories are ignored
// (see watchSet). Then it reloads if any of them changed since it was read: a change made between
// the first read and the watch (a ConfigMap updated while the pod starts) would otherwise wait
// for the next one. The gateway starts the watch before it reports ready, so that a change made
// once it serves is never missed.
func (r *Reloader) StartWatch() (*Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch config: %w", err)
	}
	// The config's directory must be watchable (a caller falls back to SIGHUP only); the others
	// are best effort.
	if err := w.Add(filepath.Dir(absPath(r.path))); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch config dir: %w", err)
	}
	r.syncWatches(w)
	_ = r.reload(false) // nothing unless a file changed since it was read; logged and counted inside
	return &Watcher{r: r, w: w, set: r.syncWatches(w)}, nil
}

// Run reloads when a watched file changes, and whenever hup receives, until ctx ends; then it
// closes the watch. Only events about the config file and the files it references count (see
// watchSet): a log file written beside the config must not wake a watcher that logs. An event
// that changed none of the files reloads nothing; a hup always recompiles. After each reload the
// watched directories and files follow what the config now references.
func (wt *Watcher) Run(ctx context.Context, hup <-chan os.Signal) {
	r, w := wt.r, wt.w
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.log.Info("SIGHUP: reloading config")
			_ = r.Reload() // logged and counted inside
			wt.set = r.syncWatches(w)
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Chmod) && !ev.Has(fsnotify.Write) || !wt.set.matters(ev.Name) {
				continue
			}
			timer.Reset(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			r.log.Warn("config watcher error", zap.Error(err))
		case <-timer.C:
			_ = r.reload(false)
			wt.set = r.syncWatches(w)
		}
	}
}
