#!/usr/bin/env bash
# Without cert-manager: makes a CA and the webhook's serving certificate with openssl, and
# writes what this overlay needs beside this script (tls.crt, tls.key, ca-bundle.yaml).
# Then: kubectl apply -k deploy/kubernetes/sidecar-injection/manual-tls
# Run it again before the certificate expires (825 days); the webhook re-reads its files.
set -euo pipefail
cd "$(dirname "$0")"
svc=sandgate-webhook.sandgate-system.svc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
  -subj "/CN=sandgate webhook CA" -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$svc" \
  -keyout tls.key -out "$tmp/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\n' "$svc" "$svc" > "$tmp/ext"
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days 825 -extfile "$tmp/ext" -out tls.crt 2>/dev/null
chmod 600 tls.key
bundle=$(base64 -w0 < "$tmp/ca.crt")
cat > ca-bundle.yaml <<PATCH
- op: add
  path: /webhooks/0/clientConfig/caBundle
  value: $bundle
- op: add
  path: /webhooks/1/clientConfig/caBundle
  value: $bundle
PATCH
echo "make-tls.sh: wrote tls.crt, tls.key and ca-bundle.yaml in $(pwd)"
