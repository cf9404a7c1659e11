"""A stand-in for petrel_client.client: ``Client().Get('s3://bucket/NAME')`` returns $FAKE_OBJECT_STORE/NAME."""
import os
import os.path as osp


class Client:

    def __init__(self, conf_path=None, enable_mc=True):
        self.root = os.environ['FAKE_OBJECT_STORE']

    def Get(self, filepath):
        with open(osp.join(self.root, osp.basename(filepath)), 'rb') as f:
            return f.read()
