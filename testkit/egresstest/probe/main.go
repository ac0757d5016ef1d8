// Command egress-probe is egresstest.Probe for images without python3: a
// static program the containerd test image carries, which tries every
// way out and prints one "name: reached|refused detail" line per try.
// Arguments: the HTTP port, the HTTPS port and the CA (PEM). It uses the
// proxy only through the environment, as tools do.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: egress-probe HTTP-PORT HTTPS-PORT CA-PEM")
		os.Exit(2)
	}
	hp, sp, ca := os.Args[1], os.Args[2], os.Args[3]
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(ca))
	// The server's certificate names example.com; the probe checks the
	// chain, the proxy checks the name.
	tlsConfig := &tls.Config{RootCAs: roots, InsecureSkipVerify: true, VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return fmt.Errorf("no certificate")
		}
		c, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		_, err = c.Verify(x509.VerifyOptions{Roots: roots})
		return err
	}}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: tlsConfig}}
	get := func(name, u string) {
		resp, err := client.Get(u)
		if err != nil {
			fmt.Printf("%s: refused %s\n", name, oneLine(err.Error()))
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK {
			fmt.Printf("%s: refused %s\n", name, resp.Status)
			return
		}
		fmt.Printf("%s: reached %s\n", name, b)
	}
	get("http-allowed", "http://example.com:"+hp+"/")
	get("https-allowed", "https://example.com:"+sp+"/")
	get("https-wildcard", "https://www.example.com:"+sp+"/")
	get("http-unlisted", "http://example.org:"+hp+"/")
	get("https-unlisted", "https://example.org:"+sp+"/")
	get("ip-literal", "http://127.0.0.2:"+hp+"/")
	get("resolves-to-loopback", "http://loop.example.net:"+hp+"/")
	get("resolves-to-private", "http://private.example.net:"+hp+"/")
	if body, err := sniMismatch(sp, tlsConfig); err != nil {
		fmt.Printf("sni-mismatch: refused %s\n", oneLine(err.Error()))
	} else {
		fmt.Printf("sni-mismatch: reached %s\n", body)
	}
	direct("direct", "127.0.0.2:"+hp)
	direct("direct-outside", "192.0.2.1:80")
}

// sniMismatch opens a tunnel to example.com through the proxy and speaks
// TLS for example.org in it.
func sniMismatch(port string, cfg *tls.Config) (string, error) {
	p, err := url.Parse(os.Getenv("HTTPS_PROXY"))
	if err != nil || p.Host == "" {
		return "", fmt.Errorf("no proxy")
	}
	c, err := net.DialTimeout("tcp", p.Host, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "CONNECT example.com:%s HTTP/1.1\r\nHost: example.com:%s\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "", err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s", resp.Status)
	}
	cfg = cfg.Clone()
	cfg.ServerName = "example.org"
	t := tls.Client(c, cfg)
	fmt.Fprint(t, "GET / HTTP/1.1\r\nHost: example.org\r\nConnection: close\r\n\r\n")
	r, err := http.ReadResponse(bufio.NewReader(t), nil)
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	return string(b), err
}

func direct(name, addr string) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Printf("%s: refused %s\n", name, oneLine(err.Error()))
		return
	}
	c.Close()
	fmt.Printf("%s: reached\n", name)
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
