"""kappa of the embedded tokens before and after each conditioner, and the factor by which it scales them."""
from typing import List, Tuple

import torch
import torch.nn as nn

from condtok_mm.engine.hooks.kappa_probe.records import KappaRecords, kappa
from condtok_mm.engine.hooks.kappa_probe.valid_tokens import batch_valid_shapes, image_token_matrices
from condtok_mm.models.layout import conditioner_stage, patch_embedding, patch_embedding_tokens


class TokenKappa:
    """Forward hooks recording, per image on its valid tokens, ``kappa/tokens_in/stage{i}`` and
    ``kappa/tokens_out/stage{i}`` (the token matrix before and after the conditioner of stage i) and
    ``scale/correction/stage{i}`` (r = ||X + C||_F / ||X||_F). Without a conditioner at stage 0 the
    patch embedding's output is recorded as both tokens_in and tokens_out of stage 0.

    Args:
        records (KappaRecords): where the values go.
        backbone (nn.Module): the backbone.
        conditioners (list[tuple[str, nn.Module]]): its (name, TokenConditioner) modules.
    """

    def __init__(self, records: KappaRecords, backbone: nn.Module, conditioners: List[Tuple[str, nn.Module]]):
        self.records = records
        self.handles = []
        for name, conditioner in conditioners:
            self.handles.append(conditioner.register_forward_hook(self._conditioner_hook(conditioner_stage(name)),
                                                                  with_kwargs=True))
        patch_embed = patch_embedding(backbone)
        if patch_embed is not None and 0 not in {conditioner_stage(n) for n, _ in conditioners}:
            self.handles.append(patch_embed.register_forward_hook(self._patch_embed_hook))

    def _conditioner_hook(self, stage: int):
        def hook(module, args, kwargs, output):
            if not self.records.active:
                return
            call = dict(zip(('tokens', 'hw_shape', 'valid_shapes'), args), **kwargs)
            hw_shape, valid_shapes = call.get('hw_shape'), call.get('valid_shapes')
            with torch.no_grad():
                for (_, before), (_, after) in zip(image_token_matrices(call['tokens'], hw_shape, valid_shapes),
                                                   image_token_matrices(output, hw_shape, valid_shapes)):
                    self.records.add(f'kappa/tokens_in/stage{stage}', kappa(before))
                    self.records.add(f'kappa/tokens_out/stage{stage}', kappa(after))
                    norm_before = before.double().flatten(1).norm(dim=1)
                    norm_after = after.double().flatten(1).norm(dim=1)
                    self.records.add(f'scale/correction/stage{stage}',
                                     norm_after / torch.where(norm_before > 0, norm_before,
                                                              torch.ones_like(norm_before)))
        return hook

    def _patch_embed_hook(self, module, args, output):
        if not self.records.active:
            return
        tokens, hw_shape = patch_embedding_tokens(output)
        valid_shapes = batch_valid_shapes(tokens.shape[0], hw_shape) if hw_shape else None
        with torch.no_grad():
            for _, matrices in image_token_matrices(tokens, hw_shape, valid_shapes):
                values = kappa(matrices)
                self.records.add('kappa/tokens_in/stage0', values)
                self.records.add('kappa/tokens_out/stage0', values)
