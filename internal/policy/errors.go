package policy

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// FieldError is one problem with one configuration field.
type FieldError struct {
	// File is the file the problem is in (the configuration's, or an rls rule file's); empty
	// for a configuration parsed from bytes and for an environment override's problem.
	File string
	// Line and Col place the problem in File, 1-based; 0 when it has no place (a required
	// field left out of a file without its parent block, an environment override).
	Line, Col int
	// Path locates the field, e.g. `policies[2].rate`; an environment override's problem is
	// located by the variable's name, e.g. `RATELIMIT_STORE_TIMEOUT`.
	Path string
	// Value is the offending value as written; empty when there is none to show.
	Value string
	// Msg says what is wrong, e.g. `unit must be s, m or h`.
	Msg string
}

// Error formats the problem as `policies[2].rate: "10/x": unit must be s, m or h`, or
// `upstream: required` when there is no value to show, after `FILE: ` when File is set.
func (e FieldError) Error() string {
	s := e.Msg
	if e.Value != "" {
		s = strconv.Quote(e.Value) + ": " + s
	}
	if e.Path != "" {
		s = e.Path + ": " + s
	}
	if e.File != "" {
		s = e.File + ": " + s
	}
	return s
}

// Text formats the problem as editors and compilers do, `FILE:LINE:COL: field.path: "value":
// problem`: Error with the line and column after the file's name when they are known.
func (e FieldError) Text() string {
	if e.File == "" || e.Line == 0 {
		return e.Error()
	}
	e2 := e
	e2.File = e.File + ":" + strconv.Itoa(e.Line) + ":" + strconv.Itoa(e.Col)
	return e2.Error()
}

// Errors is every problem found in a configuration, in file order. Parse and Validate return it
// (possibly wrapped) so that a user fixes all problems in one edit; find it with errors.As.
type Errors []FieldError

// Error puts one problem on each line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// add records a problem; value may be empty.
func (es *Errors) add(path, value, msg string) {
	*es = append(*es, FieldError{Path: path, Value: value, Msg: msg})
}

// err returns es as an error, or nil when there is no problem (never a typed nil).
func (es Errors) err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// WriteInvalid writes the report of a configuration at path that did not load or validate:
// `PATH: invalid`, then each problem of err on a line of its own.
func WriteInvalid(w io.Writer, path string, err error) {
	fmt.Fprintf(w, "%s: invalid\n", path)
	var fe Errors
	if !errors.As(err, &fe) {
		fmt.Fprintln(w, "  "+err.Error())
		return
	}
	for _, e := range fe {
		fmt.Fprintln(w, "  "+e.Text())
	}
}
