"""The ``--tenants`` file: its checks (one line naming the file, tenant and key, never a traceback),
salted hashes written in place of plain tokens, and secrets read from files or the environment
(docs/security.md)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.server.guards.tenants.rewrite import load_tenants
from flightfeed.server.guards.tenants.table import OPERATOR
from flightfeed.server.guards.tenants.tenants_file import Secrets, parse_tenants
from flightfeed.wire.errors import ConfigError

NO_SECRETS = Secrets(read_file=lambda p: Path(p).read_bytes(), environ={})

GOOD = """\
# the vision team
[tenant.vision]
token = "vision-token-1"   # plain: hashed in place at the first read
datasets = ["imagenet*", "coco-train"]
weight = 3
max_streams = 8

[tenant.speech]
token_sha256 = "{sha}"
datasets = ["librispeech"]
max_bytes_per_s = "200MiB"
"""


def _good(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(GOOD.format(sha=hashlib.sha256(b"speech-token").hexdigest()))
    path.chmod(0o640)
    return path


def test_a_good_file_gives_its_tenants_and_hashes_plain_tokens_in_place(tmp_path: Path) -> None:
    path = _good(tmp_path)
    table = load_tenants(str(path), NO_SECRETS)
    vision, speech = table.tenants["vision"], table.tenants["speech"]
    assert (vision.weight, vision.max_streams, vision.datasets) == (3.0, 8, ("imagenet*", "coco-train"))
    assert speech.max_bytes_per_s == 200 << 20 and speech.weight == 1.0
    assert vision.may_read("imagenet-val") and vision.may_read("coco-train") and not vision.may_read("coco-val")
    assert table.identify(b"vision-token-1") == (vision, next(iter(vision.credentials)))
    assert table.identify(b"speech-token")[0] is speech  # type: ignore[index]
    assert table.identify(b"vision-token-2") is None
    text = path.read_text()
    assert "vision-token-1" not in text  # the plain token is gone from the file...
    assert "# the vision team" in text and "# plain: hashed" not in text  # ...comments kept, its line replaced
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    (cred,) = vision.credentials
    assert cred.salt and f'token_sha256 = ["{cred.salt.hex()}:{cred.digest.hex()}"]' in text
    again = load_tenants(str(path), NO_SECRETS)  # read back: the same credential (streams keep going)
    assert again.tenants["vision"].credentials == vision.credentials
    assert path.read_text() == text


def test_a_plain_token_beside_hashed_ones_joins_their_list(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    old = hashlib.sha256(b"old-token").hexdigest()
    path.write_text(f'[tenant.a]\ntoken_sha256 = "{old}"\ndatasets = ["*"]\ntoken = "new-token"\n')
    table = load_tenants(str(path), NO_SECRETS)
    assert table.identify(b"old-token") is not None and table.identify(b"new-token") is not None
    text = path.read_text()
    assert "new-token" not in text and text.count("token_sha256") == 1 and old in text


def test_an_unwritable_file_keeps_plain_tokens_in_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t.toml"
    path.write_text('tenant = { a = { token = "inline-token", datasets = ["x"] } }\n')  # no [tenant.a] line
    table = load_tenants(str(path), NO_SECRETS)
    assert table.identify(b"inline-token") is not None
    assert "plain tokens kept" in caplog.text and "inline-token" not in caplog.text


def test_token_file_and_token_env_are_looked_up_through_the_secrets_given(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("file-token\n")
    text = f'[tenant.a]\ntoken_file = "{secret}"\ntoken_env = "A_TOKEN"\ndatasets = ["x"]\n'
    table = parse_tenants(text.encode(), "t.toml", Secrets(lambda p: Path(p).read_bytes(), {"A_TOKEN": "env-token"}))
    assert table.table.identify(b"file-token") and table.table.identify(b"env-token")
    with pytest.raises(ConfigError, match=r"^--tenants t.toml: \[tenant.a\] token_env A_TOKEN: no such environ"):
        parse_tenants(text.encode(), "t.toml", NO_SECRETS)


BAD = [
    ("", "no [tenant.NAME] tables"),
    ("[tenant.a\n", "cannot parse it as TOML"),
    ("other = 1\n[tenant.a]\ntoken='x'\ndatasets=['d']\n", "unknown top-level key 'other'"),
    ("[tenant.a]\ndatasets = ['d']\n", "[tenant.a]: no token"),
    ("[tenant.a]\ntoken = 'x'\n", "[tenant.a]: datasets is missing or empty"),
    ("[tenant.a]\ntoken = 'x'\ndatasets = []\n", "datasets is missing or empty"),
    ("[tenant.a]\ntoken = 'x'\ndatasets = ['d']\nwieght = 2\n", "unknown key 'wieght' (did you mean 'weight'?)"),
    ("[tenant.a]\ntoken = 'x'\ndatasets = ['d']\nweight = 0\n", "[tenant.a] weight = 0: must be > 0"),
    ("[tenant.a]\ntoken = 'x'\ndatasets = ['d']\nweight = 'heavy'\n", "weight = heavy: expected a number"),
    ("[tenant.a]\ntoken = 'x'\ndatasets = ['d']\nmax_streams = 0\n", "[tenant.a] max_streams = 0: expected a whole"),
    ("[tenant.a]\ntoken = 'x'\ndatasets = ['d']\nmax_bytes_per_s = 'fast'\n", "[tenant.a] max_bytes_per_s:"),
    ("[tenant.a]\ntoken = ''\ndatasets = ['d']\n", "[tenant.a] token: expected a non-empty string"),
    ("[tenant.a]\ntoken = 'a b'\ndatasets = ['d']\n", "[tenant.a] token contains characters"),
    ("[tenant.a]\ntoken_sha256 = 'abc'\ndatasets = ['d']\n", "[tenant.a] token_sha256: expected 64 hex digits"),
    ("[tenant.a]\ntoken = 'x'\ndatasets = ['d']\n[tenant.b]\ntoken = 'x'\ndatasets = ['e']\n", "held by tenant 'a'"),
    ("[tenant.'a b']\ntoken = 'x'\ndatasets = ['d']\n", "[tenant.a b]: a tenant name is 1-64 letters"),
    ("[tenant.a]\ntoken_file = '/nonexistent/tok'\ndatasets = ['d']\n", "token_file /nonexistent/tok: cannot read"),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_a_bad_file_is_one_line_naming_file_tenant_and_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_tenants(text.encode(), "/etc/ff/tenants.toml", NO_SECRETS)
    message = str(info.value)
    assert message.startswith("--tenants /etc/ff/tenants.toml: ") and "\n" not in message
    assert expected in message


def test_a_token_never_appears_in_an_error() -> None:
    text = "[tenant.a]\ntoken = ['super-secret-token', 3]\ndatasets = ['d']\n"
    with pytest.raises(ConfigError) as info:
        parse_tenants(text.encode(), "t.toml", NO_SECRETS)
    assert "super-secret-token" not in str(info.value) and "a list of int, str" in str(info.value)


def test_the_operator_name_cannot_be_a_tenant_of_the_file() -> None:
    with pytest.raises(ConfigError, match="a tenant name is 1-64"):
        parse_tenants(f'[tenant."{OPERATOR}"]\ntoken="x"\ndatasets=["d"]\n'.encode(), "t.toml", NO_SECRETS)


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from(["token", "token_sha256", "token_file", "token_env", "datasets", "weight", "max_streams",
                         "max_bytes_per_s", "other"])


def _toml(value: object) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else "nan"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.encode("unicode_escape").decode().replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f'"{k}" = {_toml(v)}' for k, v in enumerate(value)) + "}"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzz_any_bytes_give_tenants_or_one_line(data: bytes) -> None:
    _parses_or_one_line(data)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), st.dictionaries(_keys, _values, max_size=5), max_size=3))
def test_fuzz_structured_tenants_give_tenants_or_one_line(tenants: dict[str, dict[str, object]]) -> None:
    lines = []
    for name, body in tenants.items():
        lines.append(f"[tenant.{_toml(name)}]")
        lines += [f"{k} = {_toml(v)}" for k, v in body.items()]
    _parses_or_one_line("\n".join(lines).encode())


def _parses_or_one_line(data: bytes) -> None:
    message = ""
    try:
        parse_tenants(data, "f.toml", Secrets(lambda p: b"tok", {"V": "tok"}))
    except ConfigError as exc:  # the only exception allowed
        message = str(exc)
    if message:
        assert message.startswith("--tenants f.toml: ") and "\n" not in message and "Traceback" not in message


_FUZZ_TABLE = parse_tenants(b'[tenant.a]\ntoken = "a-token"\ndatasets = ["*"]\n', "f.toml", NO_SECRETS).table


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80) | st.text(max_size=80), max_size=3))
def test_fuzz_any_authorization_header_is_a_caller_or_one_line_unauthenticated(values: list[str | bytes]) -> None:
    import pyarrow.flight as flight

    from flightfeed.server.guards.tenants.middleware import TenantAuthFactory
    from flightfeed.server.guards.tenants.registry import TenantRegistry

    factory = TenantAuthFactory(TenantRegistry(_FUZZ_TABLE))
    message = ""
    try:
        factory.start_call(None, {"authorization": values})
    except flight.FlightUnauthenticatedError as exc:  # the only error allowed
        message = str(exc)
    if message:
        assert message.startswith("[flightfeed:Unauthenticated] missing or wrong bearer token") and "\n" not in message
    assert factory.start_call(None, {"authorization": [*values, "Bearer a-token"]}).grant.tenant.name == "a"  # type: ignore[attr-defined]
