"""Stage 2 model patches: keypoint detectors and matchers: SuperPoint's keypoints of every image at once, LightGlue's
stopping and pruning by masks, SuperGlue's and LightGlue's matching of two keypoints or more.
"""

from __future__ import annotations

import torch

from ...registration import register_patch, report_applied


# ── Stage 2: Model patches ───────────────────────────────────────────────────


def _superpoint_keypoints_at_once(model, pixel_values, output_hidden_states=None, return_dict=None):
    """SuperPoint's detection for every image of the batch at once: the pixels over the threshold away from the
    border, in row-major order (in descending score where more than `max_keypoints` qualify, then the best of them),
    padded to the most any image keeps, as eager pads them."""
    from transformers.models.superpoint.modeling_superpoint import SuperPointKeypointDescriptionOutput

    output_hidden_states = model.config.output_hidden_states if output_hidden_states is None else output_hidden_states
    pixel_values = model.extract_one_channel_pixel_values(pixel_values)
    height, width = pixel_values.shape[-2:]
    encoded = model.encoder(pixel_values, output_hidden_states=output_hidden_states, return_dict=True)
    hidden = encoded.last_hidden_state
    detector = model.keypoint_decoder
    scores = detector._get_pixel_scores(hidden).flatten(1)  # (images, pixels), row-major
    pixel = torch.arange(scores.shape[1], device=scores.device)
    row, column, border = pixel // width, pixel % width, detector.border_removal_distance
    # as eager: its far borders are measured on a map 8 times larger than the scores' (which span the image)
    inside = (row >= border) & (row < 8 * height - border) & (column >= border) & (column < 8 * width - border)
    candidate = (scores > detector.keypoint_threshold) & inside
    count = candidate.sum(1)
    # the candidates first, in row-major order (distinct keys: ONNX has no stable sort)
    order = torch.where(candidate, pixel, pixel + scores.shape[1]).argsort(dim=1)
    if detector.max_keypoints >= 0:
        best_first = torch.where(candidate, scores, -torch.inf).argsort(dim=1, descending=True)
        order = torch.where((count > detector.max_keypoints)[:, None], best_first, order)
        count = count.clamp(max=detector.max_keypoints)
    most = count.max().item()
    torch._check(most <= scores.shape[1])
    slot = torch.arange(most, device=scores.device)
    order = order.index_select(1, slot)  # not a slice: ONNX's decompositions lose an unbacked slice's end
    kept = slot < count[:, None]
    keypoints = torch.stack([order % width, order // width], dim=-1).to(scores.dtype)  # (x, y)
    descriptors = model.descriptor_decoder.conv_descriptor_b(
        model.descriptor_decoder.relu(model.descriptor_decoder.conv_descriptor_a(hidden)))
    descriptors = torch.nn.functional.normalize(descriptors, p=2, dim=1)
    descriptors = model.descriptor_decoder._sample_descriptors(keypoints, descriptors, 8).transpose(1, 2)
    keypoints = torch.where(kept[..., None], keypoints, 0) / torch.tensor([width, height], device=scores.device)
    output = SuperPointKeypointDescriptionOutput(
        keypoints=keypoints, scores=torch.where(kept, scores.gather(1, order), 0),
        descriptors=torch.where(kept[..., None], descriptors, 0), mask=kept.int(),
        hidden_states=encoded.hidden_states if output_hidden_states else None)
    use_dict = model.config.return_dict if return_dict is None else return_dict
    return output if use_dict else output.to_tuple()


@register_patch(
    "dynamo", "transformers.models.superpoint.modeling_superpoint.SuperPointForKeypointDetection.forward",
    reports=True,
    upstream="https://github.com/huggingface/transformers/issues/48243",
)
def _patch_superpoint_keypoints_of_every_image_at_once(original):
    """SuperPoint detects and describes keypoints image by image in a Python loop (each image its own count, from
    `nonzero`) and pads them to the largest count: the loop fixes the batch, and the largest of several counts read
    from the data is more than a static trace can branch on (SuperGlue's empty-set check). Every image is handled at
    once (`_superpoint_keypoints_at_once`); only the longest count is read from the data."""

    def forward(self, pixel_values, labels=None, output_hidden_states=None, return_dict=None, **kwargs):
        if labels is not None:
            return original(self, pixel_values, labels, output_hidden_states, return_dict, **kwargs)
        report_applied()
        return _superpoint_keypoints_at_once(self, pixel_values, output_hidden_states, return_dict)

    return forward


@register_patch(
    "dynamo",
    "transformers.models.lightglue.modeling_lightglue.LightGlueForKeypointMatching._match_image_pair",
    reports=True,
    upstream="https://github.com/huggingface/transformers/issues/48243",
)
def _patch_lightglue_stops_and_prunes_by_masks(original):
    """LightGlue stops each pair at the first layer confident enough (`if torch.any(stopped)`) and drops the
    keypoints it prunes from the next layers, so how much it computes is read from the data. Every layer runs on
    every pair instead: a pruned keypoint is masked out of attention rather than dropped (same values: masked keys
    weigh nothing), a pair's matches are taken from the layer where it stops, and each keypoint counts the layers
    it was kept in. Eager drops keypoints by packing the kept ones first and padding with zeros, then scatters its
    results back with -1 as the padding index: the last keypoint of an image with padding gets a padding row's
    score (small, not zero). The program zeroes what it masks and reports the last keypoint's own row there: the
    same value while nothing is pruned; once pruning has packed eager's rows it may differ by that small score."""
    from transformers.models.lightglue import modeling_lightglue as lightglue

    def _match_image_pair(self, keypoints, descriptors, height, width, mask=None, output_attentions=None,
                          output_hidden_states=None):
        # a traced keypoint count is known to be two or more here: the next patch, registered after this one, wraps
        # it and checks that first
        if (mask is None or output_attentions or output_hidden_states or self.depth_confidence <= 0
                or self.width_confidence <= 0 or keypoints.shape[2] == 0):
            return original(self, keypoints, descriptors, height, width, mask, output_attentions,
                            output_hidden_states)
        report_applied()
        pairs, _, count, _ = keypoints.shape
        valid_per_pair = mask.reshape(pairs, -1).sum(dim=1)
        keypoints = lightglue.normalize_keypoints(keypoints.reshape(pairs * 2, count, 2), height, width)
        descriptors = descriptors.reshape(pairs * 2, count, self.keypoint_detector_descriptor_dim)
        descriptors, (positions, *_) = self._keypoint_processing(descriptors, keypoints)
        live = mask.reshape(pairs * 2, count).bool()  # valid and not pruned yet
        running = torch.ones(pairs * 2, 1, dtype=torch.bool, device=keypoints.device)  # per image, pair-wise
        matches = torch.full((pairs * 2, count), -1, dtype=torch.long, device=keypoints.device)
        scores = torch.zeros(pairs * 2, count, dtype=descriptors.dtype, device=keypoints.device)
        layers_kept = torch.ones(pairs * 2, count, dtype=torch.long, device=keypoints.device)
        # eager writes its padding rows' results at index -1: the last keypoint's own row when nothing was pruned
        last_keypoint = torch.arange(count, device=keypoints.device) == count - 1
        for layer in range(self.num_layers):
            attention_mask = lightglue.create_bidirectional_mask(
                config=self.config, inputs_embeds=descriptors[:, 0:1, :], attention_mask=live.to(mask.dtype),
                allow_is_bidirectional_skip=False)
            descriptors = self.transformer_layers[layer](descriptors, positions, attention_mask=attention_mask)[0]
            last = layer == self.num_layers - 1
            if not last:
                confidences = self.token_confidence[layer](descriptors)
                confident = self._get_early_stopped_image_pairs(confidences, layer, live, num_points=valid_per_pair)
                stopping = running & confident.repeat_interleave(2)[:, None]
            else:
                stopping = running
            layer_matches, layer_scores = self._get_keypoint_matching(descriptors, live, layer)
            written = stopping & (live | last_keypoint)
            matches = torch.where(written, layer_matches, matches)
            scores = torch.where(written, layer_scores, scores)
            running = running & ~stopping
            if not last:
                matchability = self.match_assignment_layers[layer].get_matchability(descriptors)
                kept = self._get_pruning_mask(confidences, matchability, layer) & live
                layers_kept = layers_kept + (kept & running).long()
                live = torch.where(running, kept, live)
                # eager pads what it drops with zeros, and the padding rows' results reach the last keypoint
                descriptors = torch.where(live[..., None], descriptors, 0)
                positions = tuple(torch.where(live[..., None], part, 0) for part in positions)
        return (matches.reshape(pairs, 2, count), scores.reshape(pairs, 2, count),
                layers_kept.reshape(pairs, 2, count), None, None)

    return _match_image_pair


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}._match_image_pair"
    for module, model in (("superglue", "SuperGlueForKeypointMatching"),
    ("lightglue", "LightGlueForKeypointMatching"))), reports=True,
    upstream="https://github.com/huggingface/transformers/issues/48243",
)
def _patch_keypoint_matching_of_two_keypoints_or_more(original):
    """SuperGlue and LightGlue branch on an empty keypoint set, and their attention on a single keypoint: with the
    count read from the data (`_patch_superpoint_keypoints_of_every_image_at_once`) the trace cannot take either
    branch. The program takes the matching branch, for images of two keypoints or more; a batch where every image
    has fewer is refused at run time."""

    def _match_image_pair(self, keypoints, *args, **kwargs):
        if isinstance(keypoints.shape[2], torch.SymInt):
            report_applied()
            torch._check(keypoints.shape[2] > 1)
        return original(self, keypoints, *args, **kwargs)

    return _match_image_pair
