package execapi

import (
	"flag"
	"fmt"
	"time"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// Defaults of the limits; docs/exec-api.md lists them with their flags.
const (
	DefaultBindAddress      = ":10350"
	DefaultMaxExecsPerClaim = 16
	DefaultExecTimeout      = 30 * time.Minute
	DefaultMaxBodyBytes     = 64 << 20
	DefaultMaxUploads       = 16
	DefaultMaxDownloads     = 64
	DefaultAuthCacheTTL     = 10 * time.Second
	// DefaultAudience is the audience a bearer token must be issued for.
	// A token the API server accepts as its own is refused, so a token a
	// node's controller sees cannot be replayed against the API server.
	DefaultAudience = v1alpha1.ExecAudience
)

// Config is what the manager's flags set.
type Config struct {
	// BindAddress is where the HTTPS server listens; empty disables it.
	BindAddress string
	// CertFile and KeyFile are the serving certificate and key (PEM).
	CertFile, KeyFile string
	// ClientCAFile holds the CAs whose client certificates authenticate a
	// caller (CN is the user, O the groups); empty accepts bearer tokens
	// only, unless ClusterClientCA.
	ClientCAFile string
	// ClusterClientCA, without ClientCAFile, authenticates client
	// certificates against the API server's own client CA (client-ca-file
	// of ConfigMap kube-system/extension-apiserver-authentication, kept up
	// to date), as every aggregated API server does: a kubeconfig with a
	// client certificate then works on the nodes' endpoints as it works
	// against the API server. The manager sets it with --api-service.
	ClusterClientCA bool
	// MaxExecsPerClaim bounds the commands running at once for one claim;
	// one more is refused with 429.
	MaxExecsPerClaim int
	// ExecTimeout ends a command (the process is killed) after this long.
	ExecTimeout time.Duration
	// MaxBodyBytes bounds a file upload; a larger one is refused with 413.
	// Uploads stream to disk, so this bounds disk use, not memory.
	MaxBodyBytes int64
	// MaxUploads bounds the file uploads in progress at once on this
	// controller; one more is refused with 429.
	MaxUploads int
	// MaxDownloads bounds the file downloads, directory listings and MCP
	// requests being answered at once on this controller, of which one
	// namespace may have three quarters; one more is refused with 429.
	MaxDownloads int
	// AuthCacheTTL is how long TokenReview and SubjectAccessReview answers
	// are kept; revoking access takes effect after at most this long.
	AuthCacheTTL time.Duration
	// Audience is the only audience a bearer token is accepted for: every
	// TokenReview asks the API server whether the token was issued for it.
	Audience string
}

// BindFlags registers the flags of the exec API with their defaults.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.BindAddress, "api-bind-address", DefaultBindAddress, "address the exec and file API (HTTPS) binds to; 0 disables it")
	fs.StringVar(&c.CertFile, "api-tls-cert-file", "", "serving certificate of the exec and file API (PEM); empty: one signed by the cluster's exec API CA (Secret sandbox-controller-ca in --system-namespace, made when missing) for --api-advertise-address and --node-name, renewed at two thirds of --api-cert-validity")
	fs.StringVar(&c.KeyFile, "api-tls-private-key-file", "", "private key of --api-tls-cert-file (PEM)")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", "", "CA bundle whose client certificates authenticate exec and file API callers (CN user, O groups); empty: the API server's client CA (client-ca-file of ConfigMap kube-system/extension-apiserver-authentication) when --api-service is set, else bearer tokens only (checked with TokenReview)")
	fs.IntVar(&c.MaxExecsPerClaim, "api-max-execs-per-claim", DefaultMaxExecsPerClaim, "commands one SessionClaim may run at once through the API; more are refused with 429")
	fs.DurationVar(&c.ExecTimeout, "api-exec-timeout", DefaultExecTimeout, "a command run through the API is killed after this long")
	fs.Int64Var(&c.MaxBodyBytes, "api-max-body-bytes", DefaultMaxBodyBytes, "largest file upload the API accepts, in bytes; a larger one is refused with 413")
	fs.IntVar(&c.MaxUploads, "api-max-uploads", DefaultMaxUploads, "file uploads the API receives at once, across all claims, of which one namespace may have three quarters; more are refused with 429")
	fs.IntVar(&c.MaxDownloads, "api-max-downloads", DefaultMaxDownloads, "file downloads, directory listings and MCP requests the API answers at once, across all claims, of which one namespace may have three quarters; more are refused with 429")
	fs.DurationVar(&c.AuthCacheTTL, "api-auth-cache-ttl", DefaultAuthCacheTTL, "how long TokenReview and SubjectAccessReview answers are cached")
	fs.StringVar(&c.Audience, "api-audience", DefaultAudience, "the audience a bearer token must be issued for (TokenRequest or an IdP); tokens for the API server itself are refused")
}

// Enabled reports whether the API is to be served.
func (c Config) Enabled() bool { return c.BindAddress != "" && c.BindAddress != "0" }

func (c Config) withDefaults() Config {
	if c.MaxExecsPerClaim <= 0 {
		c.MaxExecsPerClaim = DefaultMaxExecsPerClaim
	}
	if c.ExecTimeout <= 0 {
		c.ExecTimeout = DefaultExecTimeout
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxUploads <= 0 {
		c.MaxUploads = DefaultMaxUploads
	}
	if c.MaxDownloads <= 0 {
		c.MaxDownloads = DefaultMaxDownloads
	}
	if c.AuthCacheTTL <= 0 {
		c.AuthCacheTTL = DefaultAuthCacheTTL
	}
	if c.Audience == "" {
		c.Audience = DefaultAudience
	}
	return c
}

func (c Config) validate() error {
	if c.CertFile == "" || c.KeyFile == "" {
		return fmt.Errorf("the exec API on %s needs a serving certificate: set --api-tls-cert-file and --api-tls-private-key-file, or --api-advertise-address for one from the cluster's CA (or --api-bind-address=0 to disable the API)", c.BindAddress)
	}
	return nil
}
