package replay

import "time"

// Progress is how far a replay has read: what a terminal's progress line shows.
type Progress struct {
	// Lines is the number of lines read so far, all logs together.
	Lines int64
	// LogTime is the newest timestamp read (the position in the logs' time); zero before the
	// first parsed line.
	LogTime time.Time
	// Done is set on the last call, once every log has been read.
	Done bool
}

// progressEvery is how many lines pass between Options.Progress calls: a call costs a clock
// read by the caller at most, and a line takes about a microsecond.
const progressEvery = 1 << 14

// progress reports to Options.Progress, if any.
func (r *Replayer) progress(done bool) {
	if r.o.Progress == nil {
		return
	}
	p := Progress{Lines: r.totals.lines, Done: done}
	if r.lastRaw != 0 {
		p.LogTime = time.Unix(0, r.lastRaw).UTC()
	}
	r.o.Progress(p)
}

// Finish reports the final progress (Done) to Options.Progress, after the last Read.
func (r *Replayer) Finish() { r.progress(true) }
