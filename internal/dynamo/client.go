package dynamo

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// ClientOptions configures NewClient.
type ClientOptions struct {
	// Region is the AWS region of the table (Required for AWS; any value for a local server).
	Region string
	// Endpoint is the base URL of a DynamoDB-API server such as DynamoDB Local
	// (Optional; empty = the AWS endpoint of Region).
	Endpoint string
	// ConfigOptions are passed to config.LoadDefaultConfig after ours (Optional), e.g. static
	// credentials for DynamoDB Local, which accepts only letters and digits in the access key id.
	ConfigOptions []func(*config.LoadOptions) error
	// Dates receives every answer's Date header with the attempt's timing, read with Now
	// (Optional; see DateObserver). The gateway measures its clock's offset with it.
	Dates DateObserver
	// Now is the clock Dates' instants are read with (Optional; default time.Now).
	Now func() time.Time
}

// Retry bounds. The decision's context deadline (store.timeout) is the real bound on a call; the
// retryer only keeps one transient failure (a dropped connection, a 500) from deciding the request,
// without a retry storm past the deadline while DynamoDB is slow or throttling.
const (
	maxAttempts = 2
	maxBackoff  = 20 * time.Millisecond
	// Concurrent decisions reuse connections instead of dialling; the SDK's default keeps 10 idle
	// connections per host.
	maxIdleConnsPerHost = 256
)

// NewClient builds a DynamoDB client from the standard AWS configuration chain (environment,
// shared config and credentials files, web identity, container and instance roles).
func NewClient(ctx context.Context, o ClientOptions) (*dynamodb.Client, error) {
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConnsPerHost = maxIdleConnsPerHost
	})
	opts := []func(*config.LoadOptions) error{
		config.WithRegion(o.Region),
		config.WithHTTPClient(httpClient),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(so *retry.StandardOptions) {
				so.MaxAttempts = maxAttempts
				so.MaxBackoff = maxBackoff
				// The store retries throttled calls itself, counted and within the decision's
				// deadline (see retryThrottled), also for writes the SDK must not retry.
				so.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
					if IsThrottle(err) {
						return aws.FalseTernary
					}
					return aws.UnknownTernary
				})}, retry.DefaultRetryables...)
			})
		}),
	}
	opts = append(opts, o.ConfigOptions...)
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("dynamo: load AWS config: %w", err)
	}
	return dynamodb.NewFromConfig(cfg, func(do *dynamodb.Options) {
		// A client-level RetryMaxAttempts wraps and overrides the retryer above. The config
		// loader (v1.33) does not take AWS_MAX_ATTEMPTS or max_attempts when a retryer is given,
		// so today this only restates maxAttempts; it keeps two attempts if that ever changes.
		do.RetryMaxAttempts = maxAttempts
		if o.Endpoint != "" {
			do.BaseEndpoint = aws.String(o.Endpoint)
			// DynamoDB Local's error responses carry no X-Amz-Crc32 header, so validation would
			// log a warning on every conditional-check failure, our normal rejection path.
			do.DisableValidateResponseChecksum = true
		}
		if o.Dates != nil {
			WithDates(o.Now, o.Dates)(do)
		}
	}), nil
}
