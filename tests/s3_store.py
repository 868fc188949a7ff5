"""An S3 server on loopback for the tests: moto's (PyPI `moto[server]`), in a process of its own.

Every client finds it the way it finds any S3-compatible store: boto3 and MLflow through `AWS_ENDPOINT_URL_S3`,
Beam through its `--s3_endpoint_url` option. `env()` is all a child process needs.

moto checks no credentials unless told to: `S3Server(check_credentials=True)` starts one that does (moto's IAM
access control), with one user who may only act on the bucket's `allowed/` keys, for the tests of wrong and denied
credentials.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.services import free_port

# The user of a credential-checking server: what its policy allows.
ALLOWED_PREFIX = "allowed/"


class S3Server:
    def __init__(self, bucket: str = "hpml-test", check_credentials: bool = False):
        self.bucket = bucket
        self.check_credentials = check_credentials
        self.folder = Path(tempfile.mkdtemp(prefix="hpml-s3-"))
        self.port = free_port()
        self.access_key, self.secret_key = "hpml-test", "hpml-test"
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}"

    def start(self, timeout_s: float = 60) -> S3Server:
        env = dict(os.environ)
        if self.check_credentials:  # the set-up's own calls (IAM user, key, policy, bucket) go unchecked
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "5"
        self._log = open(self.folder / "moto.log", "wb")
        self._process = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.folder)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2).read()
                break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto_server did not start: "
                                       + (self.folder / "moto.log").read_text(errors="replace")[-2000:]) from None
                time.sleep(0.1)
        if self.check_credentials:
            self._add_user()
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def _add_user(self) -> None:
        """A user whose policy allows everything on `<bucket>/allowed/*` and the bucket's listing, nothing else."""
        import boto3

        iam = boto3.client("iam", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="hpml")
        key = iam.create_access_key(UserName="hpml")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": [f"arn:aws:s3:::{self.bucket}",
                                                              f"arn:aws:s3:::{self.bucket}/{ALLOWED_PREFIX}*"]}]}
        iam.put_user_policy(UserName="hpml", PolicyName="hpml", PolicyDocument=json.dumps(policy))

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to use this server: the standard AWS variables only."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": self.url}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._process = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
