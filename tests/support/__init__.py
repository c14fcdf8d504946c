"""Helpers shared by the tests (and some benches): the test datasets (``datasets``, ``client``:
the client tests' dataset and checks, ``token_corpus``), free ports (``ports``), ``flightfeed
serve`` as a subprocess (``processes``), disk probes (``disk_probe``), network namespaces
(``netns``) and the storage fixtures (``storage_fixtures``: moto S3, metrics, small Arrow
datasets; registered for every folder by ``tests/conftest.py``)."""
