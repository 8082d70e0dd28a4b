"""A corpus of credentials in their real formats (all fake: made here from a fixed seed) and
of look-alikes that must survive redaction (tests/test_redact*.py)."""

from __future__ import annotations

import random
import string

_rng = random.Random(47)
_ALNUM = string.ascii_letters + string.digits


def _r(n: int, alphabet: str = _ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _b64(n: int) -> str:
    return _r(n, _ALNUM + "+/")


_PEM_BODY = "\n".join(_b64(64) for _ in range(6))
_PUBLIC_BODY = "\n".join(_b64(64) for _ in range(6))  # of the look-alikes

# (kind expected, the secret as it appears, the text around it). The secret's bytes must
# be gone after redaction; the text around it must stay.
SECRETS: list[tuple[str, str, str]] = [
    ("aws-access-key", "AKIA" + _r(16, string.ascii_uppercase + "234567"),
     "export AWS_ACCESS_KEY_ID={}"),
    ("aws-access-key", "ASIA" + _r(16, string.ascii_uppercase + "234567"),
     "the temporary key is {} (expires in 1h)"),
    ("secret-assignment", _b64(40), "aws_secret_access_key = {}"),
    ("private-key", "-----BEGIN PRIVATE KEY-----\n" + _PEM_BODY + "\n-----END PRIVATE KEY-----",
     'gcp service account: {}\n"client_email": "svc@proj.iam.gserviceaccount.com"'),
    ("azure-storage-key", _b64(86) + "==",
     "DefaultEndpointsProtocol=https;AccountName=devstore;AccountKey={};"
     "EndpointSuffix=core.windows.net"),
    ("azure-client-secret", _r(3) + "8Q~" + _r(34, _ALNUM + "_~.-"),
     "client secret value: {}"),
    ("azure-sas", _r(43, _ALNUM + "%") + "%3D",
     "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig={}"),
    ("openai-key", "sk-proj-" + _r(74, _ALNUM + "_-") + "1", "OPENAI key {} in .env"),
    ("openai-key", "sk-" + _r(20) + "T3BlbkFJ" + _r(19) + "7", "key={}"),
    ("anthropic-key", "sk-ant-api03-" + _r(93, _ALNUM + "_-") + "AA",
     "ANTHROPIC_API_KEY: {}"),
    ("google-api-key", "AIza" + _r(35, _ALNUM + "_-"), "?key={}&q=weather"),
    ("groq-key", "gsk_" + _r(52), "Authorization-less groq {}"),
    ("huggingface-token", "hf_" + _r(34), "huggingface-cli login --token {}"),
    ("github-token", "ghp_" + _r(36), "git clone https://{}@github.com/org/repo"),
    ("github-token", "gho_" + _r(36), "oauth {}"),
    ("github-token", "ghs_" + _r(36), "installation token {}"),
    ("github-token", "github_pat_11" + _r(20, string.ascii_uppercase + string.digits) + "_"
     + _r(59), "GH: {}"),
    ("gitlab-token", "glpat-" + _r(20, _ALNUM + "_-"), "PRIVATE-TOKEN header {}"),
    ("npm-token", "npm_" + _r(36), "//registry.npmjs.org/:_authToken={}"),
    ("pypi-token", "pypi-AgEIcHlwaS5vcmc" + _r(60, _ALNUM + "_-"), "password = {}"),
    ("slack-token", "xoxb-" + _r(12, string.digits) + "-" + _r(13, string.digits) + "-"
     + _r(24), "slack bot {}"),
    ("slack-webhook", "T" + _r(8, string.ascii_uppercase) + "/B" + _r(8, string.ascii_uppercase)
     + "/" + _r(24), "POST https://hooks.slack.com/services/{}"),
    ("stripe-key", "sk_live_" + _r(24), "Stripe.api_key = '{}'"),
    ("stripe-key", "rk_live_" + _r(24), "restricted {}"),
    ("private-key", "-----BEGIN RSA PRIVATE KEY-----\n" + _PEM_BODY
     + "\n-----END RSA PRIVATE KEY-----", "$ cat id_rsa\n{}\n$"),
    ("private-key", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + _PEM_BODY,
     "cat ~/.ssh/id_ed25519 | head\n{}"),
    ("jwt", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwiaWF0IjoxNTE2MjM5"
     "MDIyfQ." + _r(43, _ALNUM + "_-"), "cookie: session={}; Path=/"),
    ("url-password", "s3cr3t-" + _r(10), "DATABASE_URL=postgresql://admin:{}@db.internal:5432/app"),
    ("secret-assignment", "hunter2" + _r(6), "DB_PASSWORD={}"),
    ("secret-assignment", _r(24), 'export GITHUB_TOKEN="{}"'),
    ("secret-assignment", "django-insecure-" + _r(20), "SECRET_KEY = '{}'"),
    ("bearer-token", _r(40, _ALNUM + "._-"), "Authorization: Bearer {}"),
]

# Look-alikes: each must come out exactly as it went in.
LOOK_ALIKES: list[str] = [
    "01HZX3K4V5W6Y7Z8A9B0C1D2E3",  # a ULID
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",  # sha256
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",  # a git commit
    "123e4567-e89b-12d3-a456-426614174000",  # a UUID
    "-----BEGIN CERTIFICATE-----\n" + _PUBLIC_BODY + "\n-----END CERTIFICATE-----",
    "-----BEGIN PUBLIC KEY-----\n" + _PUBLIC_BODY + "\n-----END PUBLIC KEY-----",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host",
    "Please enter your password to continue.",
    "Forgot password? Reset it from the settings page.",
    "the password field must not be empty",
    "api_key = os.environ['OPENAI_API_KEY']",
    "token = get_token(scope)",
    "SECRET_KEY = settings.SECRET_KEY",
    "password: str",
    "max_tokens=100000",
    "input_tokens: 123456",
    "tokenizer=bert-base-uncased",
    "git@github.com:org/repo.git",
    "https://example.com:8443/path?q=1",
    "scikit-learn and sklearn; task-1234; risk_live_feed",
    "secrets.token_hex(32)",
    "export API_KEY=$API_KEY",
    "password=${DB_PASSWORD}",
    "client_secret: <your-secret-here>",
    "eyJ0eXAiOiJKV1QifQ (a header alone is no token)",
    "AKIA is the prefix of AWS access key ids",
    "author: Jane Doe",
    "author_token_count=5",
]


def secret_text(index: int) -> str:
    _, secret, around = SECRETS[index]
    return around.format(secret)
