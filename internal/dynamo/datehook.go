package dynamo

import (
	"context"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// DateObserver receives, for every attempt of a call answered with a Date header, the local
// instants the attempt was sent and its response headers arrived, and the header's time (whole
// seconds). It is called on the call's goroutine: it must be fast and safe for concurrent use.
type DateObserver func(sent, received, date time.Time)

// WithDates is the client option that hands every answer's Date header to observe, with the
// attempt's timing read with now (nil: time.Now); for clients not built by NewClient.
func WithDates(now func() time.Time, observe DateObserver) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, dateHook(now, observe)) }
}

// dateHookID names the middleware in the SDK's stack.
const dateHookID = "ratelimit-proxy/ResponseDate"

// dateHook returns the API option that times every attempt and hands its Date header to observe,
// read with now. It sits last in the deserialize step, next to the transport: inside the
// retryer (one observation per attempt) and before the body is read (received is when the
// headers came). An answer with an Age header may come from a cache and is not observed.
func dateHook(now func() time.Time, observe DateObserver) func(*middleware.Stack) error {
	if now == nil {
		now = time.Now
	}
	mw := middleware.DeserializeMiddlewareFunc(dateHookID, func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (
		middleware.DeserializeOutput, middleware.Metadata, error,
	) {
		sent := now()
		out, md, err := next.HandleDeserialize(ctx, in)
		received := now()
		if resp, ok := out.RawResponse.(*smithyhttp.Response); ok && resp != nil && resp.Response != nil {
			if v := resp.Header.Get("Date"); v != "" && resp.Header.Get("Age") == "" {
				if d, perr := http.ParseTime(v); perr == nil {
					observe(sent, received, d)
				}
			}
		}
		return out, md, err
	})
	return func(s *middleware.Stack) error { return s.Deserialize.Add(mw, middleware.After) }
}
